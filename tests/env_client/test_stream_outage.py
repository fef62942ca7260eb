"""A server stopped (SIGTERM) under busy Streams: the episodes cut off see an outage, as unary and batch calls do.

Before: when a request was being written as the server ended the stream, grpc.aio gave the call its own status,
INTERNAL "Internal error from Core", in place of the server's UNAVAILABLE, and every call waiting on that stream
failed with it, unretried (the spec's INTERNAL is an env that raised). 2 of 4 fault drills; about 3 rounds in 5 here.
"""

from __future__ import annotations

import asyncio
import collections
import random
import signal

import grpc

from roll_lightning.env_client import EnvPool, EpisodeFailed
from roll_lightning.env_client.local import launch_local_server

ROUNDS = 4  # the race is per stream and per round: several of each
STREAMS = 8  # one pool, so one channel and one Stream, each
SESSIONS_PER_STREAM = 8
# what a call cut off by a stopping server ends with: UNAVAILABLE, retried until its deadline
OUTAGE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


async def _one_round() -> collections.Counter[tuple[str, str]]:
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", "--drain-seconds", "0.2"])
    seen: collections.Counter[tuple[str, str]] = collections.Counter()
    pools = [
        EnvPool([server.address], transport="stream", health_interval_s=60.0, call_timeout_s=2.0)
        for _ in range(STREAMS)
    ]
    try:
        for pool in pools:
            await pool.start()
        sessions = [await p.open("slow", {"max_steps": 1_000_000}) for p in pools for _ in range(SESSIONS_PER_STREAM)]
        await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
        rng = random.Random(0)

        async def play(session) -> None:  # steps until the server is gone; requests keep being written
            try:
                while True:
                    await session.step("go")
                    await asyncio.sleep(rng.random() * 0.01)
            except EpisodeFailed as err:
                seen[(err.code.name, err.detail)] += 1

        playing = asyncio.gather(*(play(s) for s in sessions))
        await asyncio.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)  # episodes never end: the drain runs out and cuts the streams
        await asyncio.wait_for(playing, 60)  # a hang guard
        assert sum(seen.values()) == len(sessions)
    finally:
        for pool in pools:
            await pool.close()
        server.stop()
    return seen


async def test_a_stream_cut_off_by_a_stopping_server_fails_its_calls_as_an_outage(subprocess_env) -> None:
    for _ in range(ROUNDS):
        seen = await _one_round()
        assert {code for code, _ in seen} <= {c.name for c in OUTAGE}, seen
