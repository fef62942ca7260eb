"""Env server under load (issue 50): thousands of sessions on one server process, from several client processes.

One `python -m env_servers serve frozenlake` process (its cap `--max-sessions` = `--sessions`, `--session-ttl`
short enough to see reaping) and several worker processes, each an `EnvPool` (batch transport, the trainer's
client) holding its share of the sessions, so the server is exactly full. Every session plays seeded FrozenLake
episodes (slippery, 20 steps at most) with a random think time before each step, as an LLM turn would give,
random moves and ~30% invalid replies. Nothing closes a session: the server must reap them.

Workers by role:
- ``steady`` (most sessions): think 0.5-3 s (``--think``);
- ``slow``: think 5x longer (still under the TTL: a slow client is not an idle one);
- ``frozen``: SIGSTOPped for ``--freeze`` seconds mid-run (a client that stops reading its socket), then resumed;
- ``vanish``: SIGKILLed mid-episode; its sessions stay until the server's TTL reaps them.

The parent samples the server's RSS, CPU and active sessions every second and probes the limits:
- the cap: CreateSession on a full server (when full, and again after the vanished client died: its sessions still
  hold their slots), then again once they are reaped (expected: room);
- message sizes: an action one byte over ``--max-action-bytes``, a 1 MiB Step, a BatchStep over the receive limit;
- a Stream client that sends requests and never reads the answers (the server's memory must stay flat).

Then every episode a live client played is replayed in-process (the same env, config, seed and actions) and its
observations, rewards, ends and action_valid compared. A lost step is a step sent on an accepted session that got
no OK answer, or an answer that differs from the replay.

Run:  .venv/bin/python bench/env_load.py            (5,000 sessions, about 3.5 minutes)
      .venv/bin/python bench/env_load.py --quick    (300 sessions, about 30 s)
Prints a report and writes bench/results/env_load-<utc time>[-quick].json (or ``--out``); exits 1 if a step was
lost, a refusal was not the named status, or sessions were not reaped.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402
from roll_lightning.protocol.v1 import env_pb2 as pb  # noqa: E402

ENV_ID = "frozenlake"
CONFIG = {"is_slippery": True, "max_steps": 20}
MOVES = ("Left", "Down", "Right", "Up")
ACTIONS = tuple(f"<answer>{m}</answer>" for m in MOVES) + ("I would go left.", "<answer>Jump</answer>")
ACTION_WEIGHTS = (0.175,) * 4 + (0.15, 0.15)
CALL_TIMEOUT_S = 60.0  # the pool's Step/CreateSession deadline: longer than any freeze
WINDOW_S = 5  # latency over time, in windows of this many seconds
OPEN_CONCURRENCY = 32  # CreateSession calls in flight per worker


# ------------------------------------------------------------------------------------------------------------------
# digests: what the client saw, compared with the in-process replay


def reset_digest(observation: str) -> int:
    return zlib.crc32(observation.encode())


def step_digest(observation: str, reward: float, terminated: bool, truncated: bool, valid: bool) -> int:
    return zlib.crc32(f"{observation}\0{reward!r}\0{int(terminated)}{int(truncated)}{int(valid)}".encode())


def episode_seed(worker: int, session: int, episode: int) -> int:
    return (worker + 1) * 10**9 + session * 10**4 + episode


# ------------------------------------------------------------------------------------------------------------------
# worker process


async def worker_main(spec: dict[str, Any]) -> None:
    from roll_lightning.env_client import EnvPool
    from roll_lightning.env_client.errors import EpisodeFailed

    index, role, n = spec["index"], spec["role"], spec["sessions"]
    think_lo, think_hi = spec["think"]
    out: dict[str, Any] = {"index": index, "role": role, "asked": n, "open_failures": {}, "step_failures": {}}
    failures_first: dict[str, str] = {}
    lat: list[float] = []  # ms per step call
    when: list[float] = []  # wall time the step was sent
    reset_lat: list[float] = []
    loop_lag: list[float] = []  # ms late, of 50 ms sleeps
    rpcs: list[tuple[float, int]] = []  # BatchStep RPCs: ms, items
    episodes: list[list[Any]] = []  # [seed, reset digest, action indices, [step digests]]
    sent = ok = 0

    def emit(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, "index": index, **fields}), flush=True)

    def failed(kind: str, err: EpisodeFailed) -> None:
        table = out["open_failures" if kind == "open" else "step_failures"]
        table[err.code.name] = table.get(err.code.name, 0) + 1
        failures_first.setdefault(f"{kind} {err.code.name}", err.detail)

    async with EnvPool(
        [spec["address"]], transport="batch", call_timeout_s=CALL_TIMEOUT_S, reset_timeout_s=CALL_TIMEOUT_S,
        health_interval_s=2.0, health_timeout_s=5.0, eject_after=10,
    ) as pool:  # fmt: skip
        client = pool.endpoints[0].client
        batch_mixed = client.batch_mixed

        async def timed_batch(items: Any, timeout: float) -> Any:  # the RPC's share of a step's latency
            t = time.perf_counter()
            answer = await batch_mixed(items, timeout)
            if recording:
                rpcs.append((round((time.perf_counter() - t) * 1000, 3), len(items)))
            return answer

        client.batch_mixed = timed_batch  # type: ignore[method-assign]  # the pool's step batches go through it
        recording = False
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        t0 = time.perf_counter()

        async def open_one(i: int) -> Any:
            async with gate:
                try:
                    session = await pool.open(ENV_ID, CONFIG)
                except EpisodeFailed as err:
                    failed("open", err)
                    return None
                except Exception as err:  # NoEndpointAvailable and kin: name them
                    out["open_failures"][type(err).__name__] = out["open_failures"].get(type(err).__name__, 0) + 1
                    failures_first.setdefault(f"open {type(err).__name__}", str(err))
                    return None
            seed = episode_seed(index, i, 0)
            try:
                first = await session.reset(seed=seed)
            except EpisodeFailed as err:
                failed("open", err)
                return None
            episodes.append([seed, reset_digest(first.observation), [], []])
            return session, episodes[-1]

        opened = await asyncio.gather(*(open_one(i) for i in range(n)))
        held = [(i, o) for i, o in enumerate(opened) if o is not None]
        out["held"] = len(held)
        out["open_s"] = time.perf_counter() - t0
        emit("opened", held=len(held), open_s=out["open_s"])

        line = await asyncio.get_running_loop().run_in_executor(None, _read_go, spec["go_timeout_s"])
        if line is None:
            emit("no-go")
            return
        stop_at = time.monotonic() + spec["hold_s"]
        recording = True

        async def play(i: int, session: Any, episode: list[Any]) -> None:
            nonlocal sent, ok
            rng = random.Random(episode[0])
            count = 0
            while True:
                pause = rng.uniform(think_lo, think_hi)
                if time.monotonic() + pause >= stop_at:
                    return
                await asyncio.sleep(pause)
                action = rng.choices(range(len(ACTIONS)), ACTION_WEIGHTS)[0]
                sent += 1
                t = time.perf_counter()
                when.append(time.time())
                try:
                    got = await session.step(ACTIONS[action])
                except EpisodeFailed as err:
                    failed("step", err)
                    lat.append(float("nan"))
                    return  # that session is lost to this client
                lat.append(round((time.perf_counter() - t) * 1000, 3))
                ok += 1
                episode[2].append(action)
                episode[3].append(step_digest(got.observation, got.reward, got.terminated, got.truncated,
                                              got.action_valid))  # fmt: skip
                if got.done:
                    count += 1
                    seed = episode_seed(index, i, count)
                    t = time.perf_counter()
                    try:
                        first = await session.reset(seed=seed)
                    except EpisodeFailed as err:
                        failed("reset", err)
                        return
                    reset_lat.append(round((time.perf_counter() - t) * 1000, 3))
                    episode = [seed, reset_digest(first.observation), [], []]
                    episodes.append(episode)

        async def lag() -> None:  # how late this client's event loop wakes up: its own share of the latency
            while time.monotonic() < stop_at:
                t = time.perf_counter()
                await asyncio.sleep(0.05)
                loop_lag.append(round((time.perf_counter() - t - 0.05) * 1000, 3))

        bound = spec["hold_s"] + CALL_TIMEOUT_S + 30
        tasks = [asyncio.create_task(play(i, s, e)) for i, (s, e) in held]
        ticker = asyncio.create_task(lag())
        done, pending = await asyncio.wait(tasks, timeout=bound)
        for task in [*pending, ticker]:
            task.cancel()
        out["unfinished_tasks"] = len(pending)
        # Sessions are never closed: leaving the pool closes the channel only.
    out.update(steps_sent=sent, steps_ok=ok, lat_ms=lat, sent_at=when, reset_lat_ms=reset_lat, episodes=episodes,
               loop_lag_ms=loop_lag, batch_rpcs=rpcs)  # fmt: skip
    out["failure_messages"] = failures_first
    out["cpu_s"] = sum(os.times()[:2])
    Path(spec["out"]).write_text(json.dumps(out))
    emit("done")


def _read_go(timeout: float) -> str | None:
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    return sys.stdin.readline() or None  # "" is EOF: the parent is gone


# ------------------------------------------------------------------------------------------------------------------
# parent


class Worker:
    def __init__(self, spec: dict[str, Any], log_dir: Path) -> None:
        self.spec = spec
        self.log = open(log_dir / f"worker-{spec['index']}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=REPO,
        )  # fmt: skip
        self.events: dict[str, dict[str, Any]] = {}
        self.eof = False  # its stdout is closed: it said all it will say

    def poll_events(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if ready:
            line = self.proc.stdout.readline()
            self.eof = not line
            if line.startswith("{"):
                event = json.loads(line)
                self.events[event["event"]] = event

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def wait_events(workers: list[Worker], event: str, deadline: float) -> bool:
    """Until every live worker has said ``event`` (True) or ``deadline`` (False)."""
    while time.monotonic() < deadline:
        waiting = [w for w in workers if event not in w.events and not w.eof]
        if not waiting:
            return all(event in w.events for w in workers)
        for w in waiting:
            w.poll_events(0.05)
    return False


def plan(total: int, n_steady: int) -> list[tuple[str, int]]:
    """Roles and session counts: 10% each to the slow, frozen and vanishing clients, the rest steady."""
    tenth = max(1, total // 10)
    steady = total - 3 * tenth
    roles = [("steady", steady // n_steady + (i < steady % n_steady)) for i in range(n_steady)]
    return roles + [("slow", tenth), ("frozen", tenth), ("vanish", tenth)]


def stub_for(address: str, *options: tuple[str, Any]) -> tuple[grpc.Channel, Any]:
    from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

    sizes = [("grpc.max_send_message_length", 64 * 2**20), ("grpc.max_receive_message_length", 64 * 2**20)]
    options = (*sizes, *options)
    channel = grpc.insecure_channel(address, options=options)
    return channel, pb_grpc.EnvServiceStub(channel)


def rpc(call: Any, *args: Any, **kwargs: Any) -> tuple[str, str, Any]:
    """(status name, message, reply) of one blocking call."""
    try:
        reply = call(*args, timeout=30, **kwargs)
        return "OK", "", reply
    except grpc.RpcError as err:
        return err.code().name, err.details() or "", None


def cap_probe(stub: Any, tries: int) -> dict[str, Any]:
    """``tries`` CreateSession calls: the statuses, the first message of each, the time each took, what was made."""
    codes: collections.Counter[str] = collections.Counter()
    messages: dict[str, str] = {}
    made: list[str] = []
    times = []
    for _ in range(tries):
        t = time.perf_counter()
        code, message, reply = rpc(
            stub.CreateSession, pb.CreateSessionRequest(env_id=ENV_ID, request_id=uuid.uuid4().hex)
        )
        times.append((time.perf_counter() - t) * 1000)
        codes[code] += 1
        messages.setdefault(code, message)
        if reply is not None:
            made.append(reply.session_id)
    return {"codes": dict(codes), "messages": messages, "ms_p50": float(np.median(times)), "made": made}


def size_probes(stub: Any, max_action_bytes: int) -> dict[str, Any]:
    """Message-size limits on a fresh session: what each oversized request gets, and whether the session goes on."""
    code, message, reply = rpc(stub.CreateSession, pb.CreateSessionRequest(env_id=ENV_ID, request_id=uuid.uuid4().hex))
    if reply is None:
        return {"error": f"no session for the size probes: {code} {message}"}
    sid = reply.session_id
    episode = stub.Reset(pb.ResetRequest(session_id=sid, seed=1, request_id="r"), timeout=30).episode_id

    def step_request(text: str, rid: str) -> pb.StepRequest:
        return pb.StepRequest(
            session_id=sid, episode_id=episode, step_index=0, request_id=rid, action=pb.Action(text=text)
        )

    out: dict[str, Any] = {}
    over = "x" * (max_action_bytes + 1)
    out["action_over_by_1"] = rpc(stub.Step, step_request(over, "a"))[:2]
    out["step_1mib"] = rpc(stub.Step, step_request("x" * 2**20, "b"))[:2]
    items = [step_request("x" * max_action_bytes, f"c{i}") for i in range(300)]  # ~19.7 MB, over 17.25 MiB
    out["batch_over_receive_limit"] = rpc(stub.BatchStep, pb.BatchStepRequest(items=items))[:2]
    code, message, after = rpc(stub.Step, step_request(ACTIONS[0], "d"))
    out["session_after"] = (code, message, after.step_index if after is not None else None)
    rpc(stub.CloseSession, pb.CloseSessionRequest(session_id=sid))
    return out


def stream_hog(address: str, pid: int, requests: int, hold_s: float) -> dict[str, Any]:
    """A Stream client that sends ``requests`` Steps (answered with FAILED_PRECONDITION: a wrong episode) and reads
    nothing for ``hold_s``; then reads every answer. Reports how many the server took meanwhile and its RSS.

    Without BDP probing the client's receive window stays at 64 KiB, so what was taken is the server's read-ahead
    (its bound, `STREAM_BACKLOG`, plus the transport's windows), not a big client buffer of unread answers."""
    channel, stub = stub_for(address, ("grpc.http2.bdp_probe", 0))
    proc = psutil.Process(pid)
    sid = stub.CreateSession(pb.CreateSessionRequest(env_id=ENV_ID, request_id=uuid.uuid4().hex), timeout=30).session_id
    stub.Reset(pb.ResetRequest(session_id=sid, seed=1, request_id="r"), timeout=30)
    pulled = [0]

    def produce() -> Any:
        for tag in range(requests):
            pulled[0] += 1
            step = pb.StepRequest(session_id=sid, episode_id="not-this-one", step_index=0, request_id=str(tag))
            yield pb.StreamRequest(tag=tag, step=step)

    rss0 = proc.memory_info().rss / 2**20
    call = stub.Stream(produce(), timeout=hold_s + 120)
    samples = []
    start = time.monotonic()
    while time.monotonic() - start < hold_s:
        time.sleep(min(0.5, hold_s / 4))
        samples.append((round(time.monotonic() - start, 1), pulled[0], round(proc.memory_info().rss / 2**20, 1)))
    taken = pulled[0]
    peak = max(s[2] for s in samples)
    answered = 0
    try:
        for answer in call:
            answered += answer.step.status.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
            if answered >= requests:
                break
    except grpc.RpcError as err:
        return {"error": f"{err.code().name}: {err.details()}", "answered": answered}
    call.cancel()
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=30)
    channel.close()
    return {"requests": requests, "hold_s": hold_s, "taken_while_unread": taken, "answered": answered,
            "rss_start_mb": rss0, "rss_peak_mb": peak, "samples": samples}  # fmt: skip


class Monitor:
    """Samples the server every second on a thread: RSS, CPU seconds, active sessions."""

    def __init__(self, pid: int, address: str) -> None:
        self.proc = psutil.Process(pid)
        self.channel, self.stub = stub_for(address)
        self.samples: list[tuple[float, float, float, int]] = []  # wall time, RSS MB, CPU s, active
        self.info_ms: list[tuple[float, float]] = []  # wall time, GetServerInfo round trip (answered on its loop)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def sample(self) -> tuple[float, float, float, int]:
        cpu = self.proc.cpu_times()
        t = time.perf_counter()
        code, _, info = rpc(self.stub.GetServerInfo, pb.GetServerInfoRequest())
        self.info_ms.append((time.time(), (time.perf_counter() - t) * 1000))
        row = (time.time(), self.proc.memory_info().rss / 2**20, cpu.user + cpu.system,
               info.active_sessions if info is not None else -1)  # fmt: skip
        self.samples.append(row)
        return row

    def active(self) -> int:
        return self.samples[-1][3] if self.samples else -1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.channel.close()


def replay(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Play every recorded episode in-process and compare; returns counts and the first few mismatches."""
    from env_servers.registry import get_env

    entry = get_env(ENV_ID)
    env = entry.make(entry.make_config(CONFIG))
    checked = episodes = mismatched = 0
    examples = []
    for res in results:
        for seed, first, actions, digests in res["episodes"]:
            episodes += 1
            obs, _ = env.reset(seed, None)
            bad = reset_digest(obs) != first
            for action, digest in zip(actions, digests, strict=True):
                obs, reward, terminated, truncated, info = env.step(ACTIONS[action])
                valid = bool(info.get("action_valid", True))
                bad |= step_digest(obs, float(reward), bool(terminated), bool(truncated), valid) != digest
                checked += 1
            if bad:
                mismatched += 1
                if len(examples) < 5:
                    examples.append({"worker": res["index"], "seed": seed})
    return {"episodes": episodes, "steps": checked, "mismatched_episodes": mismatched, "examples": examples}


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def latency(values: list[float]) -> dict[str, Any]:
    good = [v for v in values if v == v]
    return {"n": len(good), "p50_ms": pct(good, 50), "p90_ms": pct(good, 90), "p99_ms": pct(good, 99),
            "max_ms": max(good) if good else float("nan")}  # fmt: skip


def run_load(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    from roll_lightning.env_client.local import launch_local_server

    ttl = args.ttl
    reap_period = min(30.0, max(0.05, ttl / 4))  # app.py's reaper
    server_args = ["--max-sessions", str(args.sessions), "--session-ttl", str(ttl), "--log-level", "WARNING",
                   "--max-action-bytes", str(args.max_action_bytes)]  # fmt: skip
    res: dict[str, Any] = {
        "settings": {
            "sessions": args.sessions,
            "workers": args.workers + 3,
            "hold_s": args.hold,
            "ttl_s": ttl,
            "think_s": args.think,
            "freeze_s": args.freeze,
            "env": ENV_ID,
            "config": CONFIG,
            "server_args": server_args,
            "transport": "batch (EnvPool)",
        },  # fmt: skip
    }
    server = launch_local_server([ENV_ID], extra_args=server_args, ready_timeout_s=120)
    workers: list[Worker] = []
    monitor = Monitor(server.process.pid, server.address)
    channel, stub = stub_for(server.address)
    try:
        time.sleep(1.0)
        _, rss_start, _, _ = monitor.sample()
        res["rss_start_mb"] = rss_start
        roles = plan(args.sessions, args.workers)
        lo, hi = args.think
        for index, (role, n) in enumerate(roles):
            think = (min(lo * 5, ttl * 0.25), min(hi * 5, ttl * 0.5)) if role == "slow" else (lo, hi)
            spec = {"index": index, "role": role, "sessions": n, "think": think, "address": server.address,
                    "hold_s": args.hold, "go_timeout_s": 600, "out": str(log_dir / f"worker-{index}.json")}  # fmt: skip
            workers.append(Worker(spec, log_dir))
        t_open = time.monotonic()
        opened = wait_events(workers, "opened", time.monotonic() + 120 + args.sessions / 20)
        res["open_s"] = time.monotonic() - t_open
        if not opened:
            raise RuntimeError(f"workers did not open their sessions: {[w.events for w in workers]}")
        res["held_by_clients"] = sum(w.events["opened"]["held"] for w in workers)
        idle = res["open_s"] + max(hi, min(lo * 5, ttl * 0.25))  # a session reset first may wait this long to step
        if idle >= ttl:
            res["warning"] = (
                f"opening took {res['open_s']:.0f} s: with a first think of up to {hi:g} s, early sessions idle "
                f"past the TTL ({ttl:g} s) and are reaped (NOT_FOUND); raise --ttl"
            )
            print(res["warning"], file=sys.stderr, flush=True)
        time.sleep(1.5)
        _, rss_held, _, active = monitor.sample()
        res["held_by_server"] = active
        res["rss_held_mb"] = rss_held
        res["rss_per_session_kb"] = (rss_held - rss_start) * 1024 / max(1, active)
        res["cap_when_full"] = cap_probe(stub, args.cap_tries)

        for w in workers:
            w.go()
        t_go = time.time()
        by_role = {w.spec["role"]: w for w in workers}
        timeline: dict[str, float] = {"go": t_go}
        kill_at, freeze_at = args.hold * 0.12, args.hold * 0.5
        vanish_n = by_role["vanish"].spec["sessions"]
        end = t_go + args.hold
        while time.time() < end:
            now = time.time() - t_go
            if "kill" not in timeline and now >= kill_at:
                by_role["vanish"].proc.kill()
                timeline["kill"] = time.time()
            if "kill" in timeline and "cap_after_kill" not in res and time.time() - timeline["kill"] >= 1.0:
                res["cap_after_kill"] = cap_probe(stub, args.cap_tries)
            if "freeze" not in timeline and now >= freeze_at:
                by_role["frozen"].proc.send_signal(signal.SIGSTOP)
                timeline["freeze"] = time.time()
            if "freeze" in timeline and "thaw" not in timeline and time.time() - timeline["freeze"] >= args.freeze:
                by_role["frozen"].proc.send_signal(signal.SIGCONT)
                timeline["thaw"] = time.time()
            if (
                "kill" in timeline
                and "reaped_vanished" not in timeline
                and 0 <= monitor.active() <= args.sessions - vanish_n
            ):
                timeline["reaped_vanished"] = time.time()
                res["cap_after_reap"] = cap_probe(stub, args.cap_tries)
                for sid in res["cap_after_reap"].pop("made"):
                    rpc(stub.CloseSession, pb.CloseSessionRequest(session_id=sid))
                res["sizes"] = size_probes(stub, args.max_action_bytes)
            time.sleep(0.2)
        if "thaw" not in timeline and "freeze" in timeline:
            by_role["frozen"].proc.send_signal(signal.SIGCONT)
            timeline["thaw"] = time.time()
        live = [w for w in workers if w.spec["role"] != "vanish"]
        finished = wait_events(live, "done", time.monotonic() + CALL_TIMEOUT_S + 60)
        timeline["clients_done"] = time.time()
        res["clients_finished"] = finished
        results = []
        for w in live:
            w.proc.wait(timeout=30)
            path = Path(w.spec["out"])
            if path.exists():
                results.append(json.loads(path.read_text()))
        # Every client is gone and no session was closed: the reaper must empty the server.
        reap_deadline = time.monotonic() + ttl + reap_period + 30
        while time.monotonic() < reap_deadline and monitor.sample()[3] != 0:
            time.sleep(0.5)
        timeline["all_reaped"] = time.time() if monitor.active() == 0 else float("nan")
        res["active_at_end"] = monitor.active()
        res["rss_after_reap_mb"] = monitor.samples[-1][1]
        res["stream_hog"] = stream_hog(server.address, server.process.pid, args.hog_requests, args.hog_seconds)
        res["timeline_s"] = {k: round(v - t_go, 2) for k, v in timeline.items()}
        res["ttl_s"], res["reap_period_s"] = ttl, reap_period
        res["samples"] = [(round(t - t_go, 1), round(r, 1), round(c, 2), a) for t, r, c, a in monitor.samples]
        res["server_info_ms"] = latency([ms for t, ms in monitor.info_ms if t_go <= t <= t_go + args.hold])
    finally:
        monitor.close()
        channel.close()
        for w in workers:
            w.stop()
        server.stop()
    res.update(summarise(results, res, timeline))
    return res


def summarise(results: list[dict[str, Any]], res: dict[str, Any], timeline: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"clients": {}}
    for r in results:
        out["clients"][f"{r['index']} {r['role']}"] = {
            "held": r["held"], "steps_sent": r["steps_sent"], "steps_ok": r["steps_ok"],
            "open_failures": r["open_failures"], "step_failures": r["step_failures"],
            "failure_messages": r["failure_messages"], "cpu_s": r["cpu_s"], "unfinished_tasks": r["unfinished_tasks"],
            "latency": latency(r["lat_ms"]), "reset_latency": latency(r["reset_lat_ms"]),
        }  # fmt: skip
    behaving = [r for r in results if r["role"] in ("steady", "slow")]
    out["latency_all_behaving"] = latency([v for r in behaving for v in r["lat_ms"]])
    out["reset_latency_all"] = latency([v for r in behaving for v in r["reset_lat_ms"]])
    frozen = [r for r in results if r["role"] == "frozen"]
    out["latency_frozen_client"] = latency([v for r in frozen for v in r["lat_ms"]])
    if "freeze" in timeline and "thaw" in timeline:  # do the others wait while one client stops reading?
        steady = [r for r in results if r["role"] == "steady"]
        inside = [v for r in steady for v, t in zip(r["lat_ms"], r["sent_at"], strict=True)
                  if timeline["freeze"] <= t < timeline["thaw"]]  # fmt: skip
        out["latency_steady_while_frozen"] = latency(inside)
    out["client_loop_lag"] = latency([v for r in behaving for v in r["loop_lag_ms"]])
    out["batch_rpc"] = latency([ms for r in behaving for ms, _ in r["batch_rpcs"]])
    out["batch_rpc"]["items_mean"] = float(np.mean([n for r in behaving for _, n in r["batch_rpcs"]] or [0]))
    go = timeline.get("go", 0.0)
    windows: dict[int, list[float]] = collections.defaultdict(list)
    for r in behaving:
        for v, t in zip(r["lat_ms"], r["sent_at"], strict=True):
            windows[int((t - go) // WINDOW_S)].append(v)
    out["latency_windows"] = [(k * WINDOW_S, latency(v)["n"], latency(v)["p50_ms"], latency(v)["p99_ms"])
                              for k, v in sorted(windows.items())]  # fmt: skip
    sent = sum(r["steps_sent"] for r in results)
    ok = sum(r["steps_ok"] for r in results)
    out["steps_sent"], out["steps_ok"] = sent, ok
    hold = res["settings"]["hold_s"]
    out["steps_per_s"] = ok / hold
    samples = res.get("samples", [])
    during = [s for s in samples if 0 <= s[0] <= hold]
    if len(during) >= 2:
        out["server_cpu_fraction"] = (during[-1][2] - during[0][2]) / max(1e-9, during[-1][0] - during[0][0])
        out["server_cpu_us_per_step"] = (during[-1][2] - during[0][2]) / max(1, ok) * 1e6
        out["rss_during_hold_mb"] = {"min": min(s[1] for s in during), "max": max(s[1] for s in during)}
    check = replay(results)
    out["replay"] = check
    out["lost_steps"] = (sent - ok) + check["mismatched_episodes"]
    full = res.get("cap_when_full", {}).get("codes", {})
    after_kill = res.get("cap_after_kill", {}).get("codes", {})
    after_reap = res.get("cap_after_reap", {}).get("codes", {})
    sizes = res.get("sizes", {})
    hog = res.get("stream_hog", {})
    out["verdict"] = {
        "held_all": res.get("held_by_server") == res["settings"]["sessions"],
        "no_lost_steps": out["lost_steps"] == 0 and check["steps"] == ok,
        "no_failed_calls": not any(c["open_failures"] or c["step_failures"] for c in out["clients"].values()),
        "refused_named_when_full": set(full) == {"RESOURCE_EXHAUSTED"},
        "vanished_hold_slots_until_reaped": set(after_kill) == {"RESOURCE_EXHAUSTED"},
        "room_after_reap": set(after_reap) == {"OK"},
        "all_reaped": res.get("active_at_end") == 0,
        "sizes_refused_named": sizes.get("action_over_by_1", [""])[0] == "INVALID_ARGUMENT"
        and sizes.get("step_1mib", [""])[0] == "INVALID_ARGUMENT"
        and sizes.get("batch_over_receive_limit", [""])[0] == "RESOURCE_EXHAUSTED"
        and sizes.get("session_after", [""])[0] == "OK",
        "stream_hog_answered": hog.get("answered") == hog.get("requests"),
        "stream_hog_not_read_ahead": hog.get("taken_while_unread", 0) < hog.get("requests", 0),
        "clients_finished": bool(res.get("clients_finished")),
    }
    out["ok"] = all(out["verdict"].values())
    return out


def report(res: dict[str, Any]) -> None:
    s = res["settings"]
    print(f"\n# Env server under load: {s['sessions']:,} sessions of {s['env']} on one server process, "
          f"{s['workers']} client processes, {s['hold_s']:.0f} s\n")  # fmt: skip
    print(f"held: {res.get('held_by_server')} sessions (clients: {res.get('held_by_clients')}), opened in "
          f"{res.get('open_s', 0):.1f} s")  # fmt: skip
    print(f"server RSS: start {res['rss_start_mb']:.1f} MB, all held {res.get('rss_held_mb', 0):.1f} MB "
          f"({res.get('rss_per_session_kb', 0):.1f} KB per session), during the run "
          f"{res.get('rss_during_hold_mb')}, after reaping {res.get('rss_after_reap_mb', 0):.1f} MB")  # fmt: skip
    print(f"steps: {res['steps_ok']:,} answered of {res['steps_sent']:,} sent ({res['steps_per_s']:.0f}/s); "
          f"server CPU {res.get('server_cpu_fraction', 0):.0%} of a core, "
          f"{res.get('server_cpu_us_per_step', 0):.0f} us a step")  # fmt: skip
    print("\n| clients | steps | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|")
    for name, key in (("steady + slow (behaving)", "latency_all_behaving"), ("resets (behaving)", "reset_latency_all"),
                      ("steady, while one client was frozen", "latency_steady_while_frozen"),
                      ("the frozen client itself", "latency_frozen_client")):  # fmt: skip
        lat = res.get(key)
        if lat:
            print(f"| {name} | {lat['n']:,} | {lat['p50_ms']:.1f} | {lat['p90_ms']:.1f} | {lat['p99_ms']:.1f} "
                  f"| {lat['max_ms']:.1f} |")  # fmt: skip
    for name, key in (("BatchStep RPCs of the behaving clients (items: batch_rpc.items_mean)", "batch_rpc"),
                      ("client event loops, late by (50 ms sleeps)", "client_loop_lag"),
                      ("server: GetServerInfo round trip (once a second)", "server_info_ms")):  # fmt: skip
        lat = res.get(key)
        if lat:
            print(f"| {name} | {lat['n']:,} | {lat['p50_ms']:.1f} | {lat['p90_ms']:.1f} | {lat['p99_ms']:.1f} "
                  f"| {lat['max_ms']:.1f} |")  # fmt: skip
    worst = sorted(res.get("latency_windows", []), key=lambda w: -w[3])[:4]
    print(
        "\nworst windows (s from go, steps, p50, p99 ms): "
        + "; ".join(f"{t:.0f}-{t + WINDOW_S:.0f}: {n}, {p50:.1f}, {p99:.1f}" for t, n, p50, p99 in worst)
    )
    print("\n| client | held | sent | ok | failures | p50 / p99 ms | CPU s |\n|---|---|---|---|---|---|---|")
    for name, c in res["clients"].items():
        fails = {**c["open_failures"], **c["step_failures"]} or "-"
        print(f"| {name} | {c['held']} | {c['steps_sent']} | {c['steps_ok']} | {fails} | "
              f"{c['latency']['p50_ms']:.1f} / {c['latency']['p99_ms']:.1f} | {c['cpu_s']:.0f} |")  # fmt: skip
    rp = res["replay"]
    print(f"\nreplayed in-process: {rp['episodes']:,} episodes, {rp['steps']:,} steps, "
          f"{rp['mismatched_episodes']} episodes differ; lost steps: {res['lost_steps']}")  # fmt: skip
    for key in ("cap_when_full", "cap_after_kill", "cap_after_reap"):
        probe = res.get(key, {})
        print(f"{key}: {probe.get('codes')} in {probe.get('ms_p50', 0):.1f} ms; {probe.get('messages')}")
    print(f"timeline (s from go): {res.get('timeline_s')}; TTL {res['ttl_s']} s, reaper every {res['reap_period_s']} s")
    for name, (code, message, *rest) in res.get("sizes", {}).items():
        print(f"size probe {name}: {code} {message[:150]}{rest or ''}")
    hog = res.get("stream_hog", {})
    print(f"stream client that never reads: {hog.get('taken_while_unread')} of {hog.get('requests')} requests taken "
          f"in {hog.get('hold_s')} s unread; server RSS {hog.get('rss_start_mb', 0):.1f} -> peak "
          f"{hog.get('rss_peak_mb', 0):.1f} MB; answered afterwards: {hog.get('answered')}")  # fmt: skip
    if "warning" in res:
        print(f"\nwarning: {res['warning']}")
    print(f"\nverdict: {res['verdict']}  ->  {'OK' if res['ok'] else 'FAILED'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="300 sessions, 16 s: a smoke run (CI)")
    parser.add_argument("--sessions", type=int, help="the server's cap, all held by the clients (default 5000)")
    parser.add_argument("--workers", type=int, default=3, help="steady client processes (plus slow, frozen, vanish)")
    parser.add_argument("--hold", type=float, help="seconds of play (default 120)")
    parser.add_argument("--ttl", type=float, help="the server's --session-ttl (default 30)")
    parser.add_argument("--think", type=float, nargs=2, help="think time range before a step, s (default 0.5 3)")
    parser.add_argument("--freeze", type=float, help="seconds the frozen client is stopped (default 10)")
    parser.add_argument("--max-action-bytes", type=int, default=65536)
    parser.add_argument("--cap-tries", type=int, default=20, help="CreateSession calls per cap probe")
    parser.add_argument("--out", type=Path, help="the JSON's path (default bench/results/env_load-*.json)")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(worker_main(json.loads(args.worker)))
        return 0
    quick = {"sessions": 300, "hold": 16.0, "ttl": 6.0, "think": [0.2, 1.0], "freeze": 2.0}
    full = {"sessions": 5000, "hold": 120.0, "ttl": 30.0, "think": [0.5, 3.0], "freeze": 10.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.hog_requests, args.hog_seconds = (5000, 3.0) if args.quick else (50000, 10.0)
    bench_run = Run("env_load", quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="env-load-") as tmp:
        res = run_load(args, Path(tmp))
    res["machine"] = {"psutil": psutil.__version__, "grpcio": grpc.__version__}
    path = bench_run.write(res, args.out)
    report(res)
    print(bench_run.footer())
    print(f"wrote {path}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
