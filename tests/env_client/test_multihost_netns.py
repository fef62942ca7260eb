"""The multi-host story for real: 3 env servers on 3 "hosts" (network namespaces), one cut off the network mid-run.

The cut is a pulled cable (the host's bridge port goes down), not a process kill: no RST, no ICMP, packets just
vanish. The pool must fail every call to that host with `EpisodeFailed` within a bound (never hang), eject it,
keep the episodes on the other hosts going, place new sessions only on the healthy hosts, and readmit the host
when the cable is back.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support.netns import NetnsLab, netns_unavailable_reason

from roll_lightning.env_client.errors import EpisodeFailed
from roll_lightning.env_client.pool import EnvPool
from roll_lightning.env_client.session import EnvSession

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(netns_unavailable_reason() is not None, reason=str(netns_unavailable_reason())),
    pytest.mark.timeout(120),
]

ACTIONS = ("Left", "Down", "Right", "Up")
CALL_TIMEOUT_S = 3.0
BOUND_S = CALL_TIMEOUT_S + 2.0  # "never hangs": any call to the cut host fails within this, from its start


@dataclass
class Runner:
    """Plays FrozenLake episodes on one session with random valid actions until stopped or failed."""

    session: EnvSession
    rng: random.Random
    steps: int = 0
    episodes: int = 0
    failures: list[tuple[float, float, EpisodeFailed]] = field(default_factory=list)  # (call start, raised at, err)
    later: tuple[float, float, EpisodeFailed | None] | None = None  # the call made after the first failure
    error: BaseException | None = None
    task: asyncio.Task[None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._play(stop)
        except EpisodeFailed:
            return
        except Exception as err:  # anything else is a bug: keep it for the assertions
            self.error = err

    async def _call(self, coro):
        start = time.monotonic()
        try:
            return await coro
        except EpisodeFailed as err:
            self.failures.append((start, time.monotonic(), err))
            # a later call to the same session must fail too, within the bound (a Reset: it always reaches the pool)
            later_start = time.monotonic()
            try:
                await self.session.reset(seed=self.rng.randrange(2**31))
                self.later = (later_start, time.monotonic(), None)
            except EpisodeFailed as later_err:
                self.later = (later_start, time.monotonic(), later_err)
            raise

    async def _play(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self._call(self.session.reset(seed=self.rng.randrange(2**31)))
            self.episodes += 1
            while not stop.is_set():
                outcome = await self._call(self.session.step(f"<answer>{self.rng.choice(ACTIONS)}</answer>"))
                self.steps += 1
                assert outcome.action_valid
                if outcome.done:
                    break


async def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)
    return time.monotonic() - start


@pytest.fixture
def lab():
    with NetnsLab(3) as built:
        servers = [host.start_env_server(["frozenlake"], extra_args=["--drain-seconds", "1"]) for host in built.hosts]
        assert [s.address for s in servers] == [f"{h.address}:50051" for h in built.hosts]
        yield built


async def test_cut_host_fails_fast_is_ejected_and_others_carry_on(lab: NetnsLab) -> None:
    addresses = [f"{h.address}:50051" for h in lab.hosts]
    victim, victim_addr = lab.hosts[1], addresses[1]
    survivors = [a for a in addresses if a != victim_addr]
    pool = EnvPool(
        addresses,
        health_interval_s=0.3,
        health_timeout_s=0.5,
        eject_after=2,
        call_timeout_s=CALL_TIMEOUT_S,
        reset_timeout_s=CALL_TIMEOUT_S,
    )
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    sessions: list[EnvSession] = []
    try:
        await pool.start()
        await wait_until(lambda: sorted(pool.healthy_endpoints()) == sorted(addresses), 5, "all 3 hosts healthy")

        # placement: 12 sessions spread by free capacity, 4 on each host
        for _ in range(12):
            sessions.append(await pool.open("frozenlake", {"size": 4}))
        placed = Counter(s.address for s in sessions)
        # (a 5/4/3 split here would mean a health refresh overwrote a placement still in flight: EnvPool._check)
        assert placed == Counter({a: 4 for a in addresses}), placed

        rng = random.Random(0)
        runners = [Runner(s, random.Random(rng.random())) for s in sessions]
        for r in runners:
            r.task = asyncio.create_task(r.run(stop))
        tasks = [r.task for r in runners]
        await wait_until(lambda: all(r.steps >= 3 for r in runners), 10, "every session to take steps before the cut")
        assert not [r.error for r in runners if r.error]
        assert not [r.failures for r in runners if r.failures], "a call failed before the cut"

        # -- pull the cable of one host -----------------------------------------------------------------
        victim.cut()
        t_cut = time.monotonic()
        steps_at_cut = {id(r): r.steps for r in runners}
        on_victim = [r for r in runners if r.session.address == victim_addr]
        on_survivors = [r for r in runners if r.session.address != victim_addr]

        t_eject = t_cut + await wait_until(lambda: pool.stats["ejections"] >= 1, BOUND_S, "the cut host's ejection")
        await wait_until(lambda: all(r.task.done() for r in on_victim), BOUND_S,
                         "every session on the cut host to fail")  # fmt: skip

        # (1) every in-flight and later call to the cut host failed with EpisodeFailed, within the bound
        for r in on_victim:
            assert r.error is None, r.error
            assert len(r.failures) == 1, r.failures
            start, raised, err = r.failures[0]
            assert err.endpoint == victim_addr, err
            assert err.infrastructure, err
            assert raised - start <= BOUND_S, f"a call to the cut host took {raised - start:.2f}s: {err}"
            assert raised - t_cut <= BOUND_S, f"cut host's failure surfaced {raised - t_cut:.2f}s after the cut"
            assert r.later is not None and r.later[2] is not None, "a call after the failure did not fail"
            assert r.later[1] - r.later[0] <= BOUND_S
        # a fresh call now (endpoint ejected) fails at once
        t0 = time.monotonic()
        with pytest.raises(EpisodeFailed):
            await on_victim[0].session.reset(seed=3)
        fresh_fail_s = time.monotonic() - t0
        assert fresh_fail_s <= BOUND_S

        # (2) the pool ejected exactly that endpoint
        assert pool.stats["ejections"] == 1
        assert victim_addr not in pool.healthy_endpoints()
        assert sorted(pool.healthy_endpoints()) == sorted(survivors)

        # (3) the episodes on the other hosts carry on
        await wait_until(lambda: all(r.steps >= steps_at_cut[id(r)] + 5 for r in on_survivors), 10,
                         "the surviving hosts' sessions to keep stepping after the cut")  # fmt: skip
        assert not any(r.failures or r.error for r in on_survivors), [(r.failures, r.error) for r in on_survivors]
        assert not any(r.task.done() for r in on_survivors)

        # (4) new sessions land only on the healthy hosts, and work
        fresh = [await pool.open("frozenlake", {"size": 4}) for _ in range(6)]
        sessions += fresh
        assert {s.address for s in fresh} <= set(survivors), Counter(s.address for s in fresh)
        assert Counter(s.address for s in fresh) == Counter({a: 3 for a in survivors})
        for s in fresh:
            await s.reset(seed=1)
            await s.step("<answer>Down</answer>")

        # -- plug the cable back in: the host is readmitted and takes sessions again ----------------------
        victim.restore()
        t_restore = time.monotonic()
        readmit_s = await wait_until(
            lambda: pool.stats["readmissions"] >= 1 and victim_addr in pool.healthy_endpoints(),
            15, "the restored host's readmission",
        )  # fmt: skip
        back = await pool.open("frozenlake", {"size": 4})  # the most free capacity now: 4 orphans vs 4 + 3 each
        sessions.append(back)
        assert back.address == victim_addr
        await back.reset(seed=2)
        await back.step("<answer>Right</answer>")
        assert pool.stats["ejections"] == 1

        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S * 2)
        assert not [r.error for r in runners if r.error]
        detection = sorted(r.failures[0][1] - t_cut for r in on_victim)
        gains = [r.steps - steps_at_cut[id(r)] for r in on_survivors]
        codes = Counter(f"{r.failures[0][2].code.name}: {r.failures[0][2].detail[:40]}" for r in on_victim)
        print(
            f"\ncut->ejection {t_eject - t_cut:.2f}s; cut->failures {', '.join(f'{d:.2f}' for d in detection)}s; "
            f"fresh call on ejected {fresh_fail_s * 1000:.1f}ms; restore->readmitted {readmit_s:.2f}s "
            f"(at {time.monotonic() - t_restore:.2f}s); survivor steps after cut {min(gains)}..{max(gains)}; "
            f"failures: {dict(codes)}"
        )
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        await pool.close()
