"""An outage of every env endpoint is waited out; a long one ends the run with one message, never a hang.

The server is a real subprocess (`python -m env_servers serve`) so that SIGSTOP/SIGCONT can freeze it the way a
hung host or a paused container does: no answers, no connection reset. The engine is `SimulatedEngine`: these
tests are about scheduling.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import start_server

from roll_lightning.env_client import EnvOutage, EnvPool
from roll_lightning.env_client.local import LocalServer, launch_local_server
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]
HANG_GUARD_S = 120  # far above any healthy run of these tests; only here so a regression fails instead of hanging


@pytest.fixture
def frozen_server(subprocess_env: None) -> Iterator[LocalServer]:
    server = launch_local_server(["slow"], extra_args=["--import", "support.plugin_envs", "--drain-seconds", "0.5"])
    yield server
    os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


def rollout_config(**overrides: Any) -> RolloutConfig:
    base: dict[str, Any] = {
        "env_id": "slow",
        "env_config": {"max_steps": 3, "delay_s": 0.05},
        "group_size": 4,
        "batch_size": 8,
        "concurrent_episodes": 8,
        # large, so that only the slot accounting (not the failed-group limit) decides whether the run goes on
        "max_failed_groups_in_a_row": 1000,
        "episode": EpisodeSettings(max_turns=3, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=8)),
    }
    return RolloutConfig(**{**base, **overrides})


async def blip(server: LocalServer, after_s: float, down_s: float) -> None:
    await asyncio.sleep(after_s)
    os.kill(server.process.pid, signal.SIGSTOP)
    await asyncio.sleep(down_s)
    os.kill(server.process.pid, signal.SIGCONT)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_short_outages_of_the_only_server_cost_retries_not_the_run(
    frozen_server: LocalServer, tokenizer: Any, mode: str
) -> None:
    """Three 3 s outages of the only server while batches are being collected: every batch still arrives whole.

    Before the fix this hung for good: the first member of a group to hit the outage ran through its retries at
    once (`open` raised with no healthy endpoint), its siblings were cancelled before they ever ran, and each such
    cancellation leaked a running slot until the producer could start nothing and `get_batch` waited forever."""
    async with EnvPool([frozen_server.address], health_interval_s=0.2, call_timeout_s=5.0) as pool:
        cfg = rollout_config(mode=mode)
        scheduler = RolloutScheduler(pool, SimulatedEngine(tokenizer, MOVES, latency_s=0.01), tokenizer, cfg)
        try:
            for _ in range(3):
                outage = asyncio.create_task(blip(frozen_server, after_s=0.3, down_s=3.0))
                for _ in range(2):
                    batch = await asyncio.wait_for(scheduler.get_batch(), HANG_GUARD_S)
                    assert sorted(Counter(batch.traj_group_id).values()) == [4, 4]
                    assert set(batch.step.tolist()) == {3}, "only whole episodes"
                await outage
            assert pool.stats["ejections"] >= 1, "the outage was seen (the test froze the server in time)"
            assert scheduler.counters["outage_waits"] >= 1, "failures during the outage used no retry"
            # the batch's env/ counters say so too (running totals)
            assert batch.metrics["env/ejections_total"] == pool.stats["ejections"] >= 1
            assert batch.metrics["env/failed_calls_total"] >= 1 and batch.metrics["env/resets_total"] >= 6 * 8
            # an endpoint ejected by the outage came back (readmitted) before the last batch could be played
            assert batch.metrics["env/readmissions_total"] == pool.stats["readmissions"] >= 1
            assert batch.metrics["env/batched_items_total"] >= batch.metrics["env/batches_total"]
        finally:
            await scheduler.close()
        assert scheduler.running == 0, "every episode slot is given back, however its task ended"


async def test_an_outage_longer_than_the_bound_fails_naming_the_endpoint(
    frozen_server: LocalServer, tokenizer: Any
) -> None:
    async with EnvPool(
        [frozen_server.address], health_interval_s=0.2, call_timeout_s=5.0, outage_timeout_s=2.0
    ) as pool:
        scheduler = RolloutScheduler(
            pool, SimulatedEngine(tokenizer, MOVES, latency_s=0.01), tokenizer, rollout_config()
        )
        try:
            await scheduler.get_batch()
            os.kill(frozen_server.process.pid, signal.SIGSTOP)
            with pytest.raises(EnvOutage) as info:
                await asyncio.wait_for(scheduler.get_batch(), HANG_GUARD_S)
        finally:
            await scheduler.close()
    message = str(info.value)
    assert frozen_server.address in message and "outage timeout (2s, data.envs.outage_timeout_s)" in message
    assert "down for" in message


async def test_groups_dropped_while_siblings_never_started_give_their_slots_back(tokenizer: Any) -> None:
    """The scheduler-level reproduction of the leak: a server with room for one session refuses the second member
    of each group at once, so (with no retries) the group is dropped before its other members ever run. Every
    such member must give its running slot back, or the producer soon starts nothing and `get_batch` waits
    forever; here the failed-group limit must end the run with its message instead."""
    server = start_server(env_ids=("slow",), max_sessions=1)
    try:
        async with EnvPool([server.address], health_interval_s=0.2) as pool:
            cfg = rollout_config(episode_retries=0, max_failed_groups_in_a_row=3)
            scheduler = RolloutScheduler(pool, SimulatedEngine(tokenizer, MOVES, latency_s=0.01), tokenizer, cfg)
            try:
                with pytest.raises(RuntimeError, match="3 groups in a row"):
                    await asyncio.wait_for(scheduler.get_batch(), HANG_GUARD_S)
                assert scheduler.running == 0, "members cancelled before they started still give their slot back"
            finally:
                await scheduler.close()
    finally:
        server.stop()
