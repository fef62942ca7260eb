"""EnvPool against real servers: placement, transports, batching, local servers, killed servers, drain."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import grpc
import pytest
from support.servers import start_server

from roll_lightning.env_client import EnvOutage, EnvPool, EpisodeFailed, NoEndpointAvailable
from roll_lightning.env_client.local import launch_local_server
from roll_lightning.protocol.v1 import env_pb2 as pb

ACTIONS = ["<answer>Left</answer>", "<answer>Down</answer>", "<answer>Right</answer>", "<answer>Up</answer>", "bad"]


async def play(session, seed: int, steps: int) -> list[tuple[str, float, bool]]:
    trace = [(await session.reset(seed=seed)).observation]
    for i in range(steps):
        out = await session.step(ACTIONS[(seed + i) % len(ACTIONS)])
        trace.append((out.observation, out.reward, out.action_valid, sorted(out.info.items()), out.metrics))
        if out.done:
            break
    return trace


async def test_placement_follows_free_capacity():
    small, large = start_server(max_sessions=4), start_server(max_sessions=8)
    try:
        async with EnvPool([small.address, large.address]) as pool:
            sessions = [await pool.open("frozenlake") for _ in range(8)]
            where = [s.address for s in sessions]
            assert where.count(small.address) == 2 and where.count(large.address) == 6
            sessions += [await pool.open("frozenlake") for _ in range(4)]
            with pytest.raises(NoEndpointAvailable, match="no endpoint can take"):
                await pool.open("frozenlake")
            await sessions[0].close()
            assert (await pool.open("frozenlake")).address == sessions[0].address
    finally:
        small.stop()
        large.stop()


async def test_full_server_behind_the_pools_back_falls_over_to_another():
    a, b = start_server(max_sessions=1), start_server(max_sessions=4)
    try:
        async with EnvPool([a.address, b.address]) as pool:
            other = EnvPool([a.address])
            await other.start()
            await other.open("frozenlake")  # fills `a` without `pool` knowing
            pool.endpoints[0].capacity = 100  # pretend its view is stale and favours `a`
            session = await pool.open("frozenlake")
            assert session.address == b.address
            await other.close()
    finally:
        a.stop()
        b.stop()


async def test_bad_env_or_config_fails_fast_with_the_reason(server):
    async with EnvPool([server.address]) as pool:
        with pytest.raises(EpisodeFailed, match="config.size_x") as info:
            await pool.open("frozenlake", {"size_x": 3})
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(EpisodeFailed, match="nope"):
            await pool.open("nope")


@pytest.mark.parametrize("env_id", ["frozenlake", "sokoban"])
async def test_transports_agree(server, env_id):
    traces = {}
    for transport in ("batch", "stream", "unary"):
        async with EnvPool([server.address], transport=transport) as pool:
            session = await pool.open(env_id)
            traces[transport] = await play(session, seed=21, steps=12)
    assert traces["batch"] == traces["stream"] == traces["unary"]
    if env_id == "sokoban":
        assert all(dict(step[3])["boxes_on_target"] >= 0 for step in traces["batch"][1:]), "info arrives"


async def test_concurrent_steps_are_batched(server):
    async with EnvPool([server.address]) as pool:
        sessions = [await pool.open("slow", {"max_steps": 50}) for _ in range(32)]
        await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
        before = pool.counters()
        for _ in range(5):
            await asyncio.gather(*(s.step("go") for s in sessions))
        batches = pool.counters()["batches"] - before["batches"]
        items = pool.counters()["batched_items"] - before["batched_items"]
        assert items == 5 * 32 and batches <= 5 * 4, f"{items} steps took {batches} BatchStep calls"


async def test_resets_travel_inside_batch_step(server):
    async with EnvPool([server.address]) as plain:
        assert not plain.endpoints[0].mixed, "opt-in"
    async with EnvPool([server.address], mixed_batches=True) as pool:
        assert pool.endpoints[0].mixed, "the Python server advertises batch-mixed"
        sessions = [await pool.open("frozenlake", {"max_steps": 1}) for _ in range(8)]
        firsts = await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
        stepping, resetting = sessions[:4], sessions[4:]
        for _ in range(4):  # half the sessions step (and end their episode) while the other half reset
            before = pool.counters()["batches"]
            outs = await asyncio.gather(
                *(s.step("bad") for s in stepping), *(s.reset(seed=sessions.index(s)) for s in resetting)
            )
            assert pool.counters()["batches"] - before == 1, "steps and resets shared one BatchStep"
            assert all(o.done for o in outs[:4])
            assert [o.observation for o in outs[4:]] == [firsts[sessions.index(s)].observation for s in resetting]
            stepping, resetting = resetting, stepping


async def test_resets_a_server_ignored_in_batch_step_are_resent(monkeypatch):
    """A server that claims batch-mixed but answers no `resets` (an older one behind the same address): the client
    notices the short answer and sends those resets as a BatchReset."""
    from env_servers.server.service import EnvService

    async def old_batch_step(self, request, context):
        (items,) = await self._run_batch({"step": request.items}, context)
        return pb.BatchStepResponse(items=items)

    monkeypatch.setattr(EnvService, "BatchStep", old_batch_step)
    server = start_server()
    try:
        async with EnvPool([server.address], mixed_batches=True) as pool:
            assert pool.endpoints[0].mixed
            sessions = [await pool.open("frozenlake", {"max_steps": 1}) for _ in range(4)]
            await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
            for _ in range(3):
                await asyncio.gather(*(s.step("bad") for s in sessions[:2]), *(s.reset(seed=9) for s in sessions[2:]))
                await asyncio.gather(*(s.reset(seed=9) for s in sessions[:2]))
    finally:
        server.stop()


async def test_same_seed_same_start_in_two_server_processes():
    async with EnvPool("local", local_envs=["sokoban", "frozenlake"], local_servers=2) as pool:
        assert len({ep.address for ep in pool.endpoints}) == 2
        for env_id, config in (("sokoban", {"dim_room": [7, 7], "num_boxes": 2}), ("frozenlake", {"size": 6})):
            first = [await pool.open(env_id, config) for _ in range(2)]
            assert first[0].address != first[1].address
            starts = [(await s.reset(seed=123)).observation for s in first]
            assert starts[0] == starts[1]
        processes = [server.process for server in pool.local]
    assert all(p.poll() is not None for p in processes), "the pool stops the servers it started"


async def test_closing_the_pool_closes_the_sessions_it_left_open(server):
    """Episodes still in progress when their pool closes belong to nobody: the pool closes their sessions, so the
    server holds none and a drain (its own local servers' stop) has no episode to wait for."""
    async with EnvPool([server.address]) as pool:
        sessions = [await pool.open("frozenlake") for _ in range(3)]
        for session in sessions:
            await session.reset(seed=1)
        await sessions[0].close()
        assert server.server.table.episodes_in_progress() == 2 and pool.open_sessions == set(sessions[1:])
    assert len(server.server.table) == 0 and all(session.closed for session in sessions)


async def test_killed_server_fails_the_episode_within_the_deadline(subprocess_env):
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs"])
    try:
        async with EnvPool([server.address], call_timeout_s=2.0, health_interval_s=10.0) as pool:
            session = await pool.open("slow", {"max_steps": 100})
            await session.reset(seed=1)
            await session.step("go")
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
            start = time.monotonic()
            with pytest.raises(EpisodeFailed) as info:
                await session.step("go")
            assert time.monotonic() - start < 2.0 + 2.0, "an unreachable server must not outlive the deadline (+ slack)"
            assert info.value.code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
            assert info.value.session_id == session.session_id and info.value.infrastructure
    finally:
        server.stop()


async def test_ejection_fails_waiting_calls_at_once(subprocess_env):
    drain = ["--drain-seconds", "0.5"]  # at the end a 20 s step is still running: do not wait for it
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", *drain])
    try:
        async with EnvPool(
            [server.address], call_timeout_s=30.0, health_interval_s=0.2, eject_after=2, outage_timeout_s=0.5
        ) as pool:
            session = await pool.open("slow", {"delay_s": 20.0})
            await session.reset(seed=1)
            pending = asyncio.ensure_future(session.step("go"))  # blocks inside the env for 20 s
            await asyncio.sleep(0.3)
            os.kill(server.process.pid, signal.SIGSTOP)  # a hung host: no RST, no answers
            start = time.monotonic()
            with pytest.raises(EpisodeFailed, match="ejected"):
                await pending
            assert time.monotonic() - start < 5.0, "ejection, not the 30 s deadline, ended the call"
            assert pool.stats["ejections"] == 1 and pool.healthy_endpoints() == []
            named = f"down for .*outage timeout \\(0.5s, data.envs.outage_timeout_s\\): {server.address} \\(ejected"
            with pytest.raises(EnvOutage, match=named):
                await pool.open("slow")  # the outage outlasted what this pool waits out
            os.kill(server.process.pid, signal.SIGCONT)
            for _ in range(50):
                await asyncio.sleep(0.1)
                if pool.healthy_endpoints():
                    break
            assert pool.stats["readmissions"] == 1 and await pool.open("slow")
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


async def test_open_waits_out_an_outage_of_every_endpoint(subprocess_env):
    """With every endpoint down, `open` waits for one to come back (it used to fail at once, burning retries)."""
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs"])
    try:
        async with EnvPool([server.address], health_interval_s=0.2, health_timeout_s=0.2) as pool:
            os.kill(server.process.pid, signal.SIGSTOP)
            while pool.healthy_endpoints():
                await asyncio.sleep(0.05)
            opening = asyncio.ensure_future(pool.open("slow"))
            await asyncio.sleep(1.0)
            assert not opening.done() and pool.in_outage, "waits while the only endpoint is down"
            os.kill(server.process.pid, signal.SIGCONT)
            session = await asyncio.wait_for(opening, 60)  # a hang guard
            assert session.address == server.address and not pool.in_outage
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


async def test_sigterm_drains_gracefully(subprocess_env):
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", "--drain-seconds", "5"])
    try:
        async with EnvPool([server.address], health_interval_s=60.0) as pool:
            session = await pool.open("slow", {"delay_s": 1.0})
            await session.reset(seed=1)
            in_flight = asyncio.ensure_future(session.step("go"))
            await asyncio.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            with pytest.raises(EpisodeFailed) as refused:
                await pool.endpoints[0].client.create_session(
                    __import__("roll_lightning.protocol.v1.env_pb2", fromlist=["x"]).CreateSessionRequest(
                        env_id="slow", request_id="late"
                    ),
                    timeout=0.5,
                )
            assert refused.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            assert (await in_flight).observation.endswith("t=1"), "the in-flight step finished during the drain"
        assert server.process.wait(timeout=10) == 0
    finally:
        server.stop()


async def test_sigterm_lets_every_episode_in_progress_finish_then_exits(subprocess_env):
    """Before: with --drain-seconds 45, 55-61 of 64 episodes in progress ended CANCELLED within 0.01 s of the
    SIGTERM (their next BatchStep was a new call, refused at once). Now their steps are served to the end, new
    episodes are refused as draining, and the server exits once the last episode has ended."""
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", "--drain-seconds", "45"])
    try:
        async with EnvPool([server.address], transport="batch", health_interval_s=0.2) as pool:
            sessions = [await pool.open("slow", {"max_steps": 6, "delay_s": 0.01}) for _ in range(64)]
            await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
            # One episode is held open until the refusal is checked: without it the drain can end, and the
            # server exit, before the new reset below reaches it (then it sees "connection refused", not
            # "draining"; seen once in CI).
            held = await pool.open("slow", {"max_steps": 1, "delay_s": 0.01})
            await held.reset(seed=99)

            async def play_out(session) -> int:
                steps = 0
                while not (await session.step("go")).done:
                    steps += 1
                return steps + 1

            playing = asyncio.gather(*(play_out(s) for s in sessions))
            await asyncio.sleep(0.05)
            server.process.send_signal(signal.SIGTERM)
            assert await playing == [6] * 64, "every episode in progress played to its end during the drain"
            with pytest.raises(EpisodeFailed) as refused:
                await sessions[0].reset(seed=100)
            assert refused.value.draining, refused.value
            assert not pool.endpoints[0].accepting
            assert server.process.poll() is None, "the server waits for the held episode"
            assert (await held.step("go")).done, "an episode in progress is still served while draining"
            code = await asyncio.get_running_loop().run_in_executor(None, server.process.wait, 20)
            assert code == 0, "the server stopped once no episode was in progress, long before its 45 s"
    finally:
        server.stop()


async def test_pool_refuses_bad_endpoints():
    with pytest.raises(ValueError, match="not host:port"):
        EnvPool(["localhost"])
    with pytest.raises(ValueError, match="local_envs"):
        EnvPool("local")
    with pytest.raises(NoEndpointAvailable, match="127.0.0.1:1"):
        await EnvPool(["127.0.0.1:1"], health_timeout_s=0.5, start_timeout_s=1.0).start()


async def test_start_waits_for_servers_that_are_still_loading():
    from support.plugin_envs import LOADING

    from env_servers.server import EnvServer, ServerConfig

    LOADING.clear()
    server = EnvServer(ServerConfig(env_ids=("slowload",), port=0))
    starting = asyncio.create_task(server.start())
    while server._server is None:
        await asyncio.sleep(0.01)
    pool = EnvPool([server.address], health_interval_s=0.1, start_timeout_s=20.0)
    opening = asyncio.create_task(pool.start())
    await asyncio.sleep(0.5)
    assert not opening.done(), "the pool waits while the server is NOT_SERVING"
    LOADING.set()
    await asyncio.gather(starting, opening)
    try:
        session = await pool.open("slowload")
        assert (await session.reset(seed=4)).observation == "seed=4 t=0"
    finally:
        LOADING.set()
        await pool.close()
        await server.drain_and_stop(0.1)


async def test_sigterm_exits_after_the_drain_even_with_a_stuck_env(subprocess_env):
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", "--drain-seconds", "0.5"])
    try:
        async with EnvPool([server.address], health_interval_s=60.0, call_timeout_s=3.0) as pool:
            session = await pool.open("slow", {"delay_s": 60.0})
            await session.reset(seed=1)
            stuck = asyncio.ensure_future(session.step("go"))
            await asyncio.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            code = await asyncio.get_running_loop().run_in_executor(None, server.process.wait, 20)
            assert code == 0, "a stuck env call is abandoned after the drain, not waited for"
            with pytest.raises(EpisodeFailed):
                await stuck
    finally:
        server.stop()


async def test_a_batch_of_slow_steps_runs_on_many_server_threads(server: object) -> None:
    """Slow env steps (I/O-bound envs) in one BatchStep are spread over the server's threads, not run in turn."""
    from support.plugin_envs import _CounterEnv

    async with EnvPool([server.address]) as pool:
        sessions = [await pool.open("slow", {"max_steps": 10, "delay_s": 0.05}) for _ in range(8)]
        for s in sessions:
            await s.reset(seed=1)
        _CounterEnv.max_in_step = 0
        for _ in range(3):  # the first batch measures the per-item cost; later ones are spread
            await asyncio.gather(*(s.step("go") for s in sessions))
    assert _CounterEnv.max_in_step > 1
