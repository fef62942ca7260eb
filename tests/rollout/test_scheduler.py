"""Scheduling: groups, staleness, redundancy, retries, timeouts, suspend/resume and resume-from-state.

These tests are about *scheduling*, so the engine is `SimulatedEngine` (fixed latency, scripted replies); the
env servers are real gRPC servers on 127.0.0.1. The real-model path is in test_rollout_real_model.py.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from typing import Any

import pytest

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import (
    ContextBudgetError,
    EpisodeSettings,
    RolloutConfig,
    RolloutConfigError,
    RolloutScheduler,
    group_seed,
)
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]


def config(**overrides: Any) -> RolloutConfig:
    episode = overrides.pop("episode", None) or EpisodeSettings(
        max_turns=4, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)
    )
    base: dict[str, Any] = {
        "env_id": "sokoban",
        "env_config": {"dim_room": [6, 6], "num_boxes": 1},
        "group_size": 2,
        "batch_size": 4,
        "concurrent_episodes": 8,
        "episode": episode,
    }
    return RolloutConfig(**{**base, **overrides})


def engine(tokenizer: Any, replies: list[str] = MOVES, latency_s: float = 0.005, seed: int = 0) -> SimulatedEngine:
    return SimulatedEngine(tokenizer, replies, latency_s=latency_s, seed=seed)


def first_observations(batch: Any) -> dict[str, set[str]]:
    by_group: dict[str, set[str]] = {}
    for group, anchor in zip(batch.traj_group_id, batch.anchor, strict=True):
        by_group.setdefault(group, set()).add(anchor)
    return by_group


async def test_batches_hold_whole_groups_that_start_from_the_same_state(pool: EnvPool, tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(batch_size=6, group_size=3))
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert len(batch) == 6 and batch.layout.name == "trajectory"
    assert sorted(Counter(batch.traj_group_id).values()) == [3, 3]
    assert all(len(obs) == 1 for obs in first_observations(batch).values())  # same seed => same start
    assert len(set(batch.traj_id)) == 6
    seeds = {g.rsplit("/s", 1)[1] for g in batch.traj_group_id}
    assert seeds == {str(group_seed(0, 0)), str(group_seed(0, 1))}
    # rows are consistent: the response tokens are the replies, the rewards sit on reply tokens
    assert bool((batch.scores != 0).le(batch.response_mask).all())
    assert bool(batch.prompt_mask.logical_and(batch.response_mask).logical_not().all())
    assert batch.metrics["rollout/episodes"] == 6 and 0 <= batch.metrics["rollout/invalid_action_rate"] <= 1


async def test_on_policy_starts_only_the_groups_a_batch_needs(pool: EnvPool, tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(max_staleness=0))
    try:
        await scheduler.get_batch()
        await asyncio.sleep(0.2)  # nothing may run ahead while the trainer trains
        started_after_first = scheduler.lanes[0].sequence.next_local
        await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert started_after_first == 2  # batch_size 4 / group_size 2
    assert scheduler.lanes[0].sequence.next_local == 4


async def test_staleness_bound_lets_the_producer_run_ahead(pool: EnvPool, tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(max_staleness=1))
    try:
        await scheduler.get_batch()
        for _ in range(100):
            if scheduler.ready >= 2:
                break
            await asyncio.sleep(0.05)
        assert scheduler.ready == 2  # one batch ahead, not more
        assert scheduler.lanes[0].sequence.next_local == 4
    finally:
        await scheduler.close()


async def test_groups_older_than_max_staleness_are_dropped_after_a_weight_update(pool: EnvPool, tokenizer: Any) -> None:
    sim = engine(tokenizer)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config(max_staleness=1))
    try:
        await scheduler.get_batch()  # the producer now fills one batch ahead at version 0
        while scheduler.ready < 2:
            await asyncio.sleep(0.05)
        await scheduler.suspend()
        await sim.load_weights({}, version=2)  # two versions later: those groups are too stale
        await scheduler.resume()
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert set(batch.policy_version.tolist()) == {2}
    assert batch.metrics["rollout/dropped_groups_stale_total"] == 2
    assert batch.metrics["rollout/staleness_mean"] == 0


async def test_admit_trains_every_group_it_starts_and_none_outlives_the_bound(pool: EnvPool, tokenizer: Any) -> None:
    """``staleness: admit``: a weight update after every batch, replies with a long tail, and the producer one
    batch ahead; batches take the oldest started groups, so no group is dropped as stale, none is skipped, and
    every trained reply is at most ``max_staleness`` versions old."""
    draws = iter([0.2 if k % 7 == 3 else 0.002 for k in range(100_000)])  # a slow reply now and then
    sim = SimulatedEngine(tokenizer, MOVES, latency_s=lambda: next(draws), seed=0)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config(max_staleness=1, staleness="admit"))
    trained: list[str] = []
    try:
        for version in range(1, 9):
            batch = await scheduler.get_batch()
            assert max(version - 1 - v for v in batch.policy_version.tolist()) <= 1
            trained += sorted(set(batch.traj_group_id))
            await scheduler.suspend()
            await sim.load_weights({}, version=version)
            await scheduler.resume()
    finally:
        await scheduler.close()
    assert scheduler.counter("dropped_stale") == 0
    assert [int(g.split("/")[1][1:]) for g in trained] == list(range(16)), "every group once, in start order"


async def test_redundant_members_race_and_only_group_size_are_kept(pool: EnvPool, tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(group_redundancy=2, concurrent_episodes=16))
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert sorted(Counter(batch.traj_group_id).values()) == [2, 2]
    assert len(batch.episode_metrics) == 4


async def test_failed_episodes_are_replayed_with_the_same_seed_then_the_group_is_dropped(
    pool: EnvPool, tokenizer: Any
) -> None:
    """`crashy` fails a step whose action says "crash": such episodes are retried on a fresh session, and a
    group whose member keeps failing is dropped whole; the batch still holds only complete groups."""
    sim = engine(tokenizer, replies=["go", "go", "go", "crash"], seed=1)
    cfg = config(env_id="crashy", env_config={"max_steps": 3}, episode_retries=1, max_failed_groups_in_a_row=50)
    scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert sorted(Counter(batch.traj_group_id).values()) == [2, 2]
    assert scheduler.counters["episode_retries"] > 0
    assert batch.metrics["env/dropped_groups_failed_total"] > 0
    for traj in set(batch.traj_id):  # every kept episode ran to its end: no partial episode is trained on
        rows = [i for i, t in enumerate(batch.traj_id) if t == traj]
        assert batch.step[rows[0]].item() == 3


async def test_get_batch_raises_instead_of_hanging_when_every_group_fails(pool: EnvPool, tokenizer: Any) -> None:
    sim = engine(tokenizer, replies=["crash"])
    cfg = config(env_id="crashy", env_config={}, episode_retries=1, max_failed_groups_in_a_row=3)
    scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
    try:
        with pytest.raises(RuntimeError, match="3 groups in a row.*INTERNAL"):
            await scheduler.get_batch()
    finally:
        await scheduler.close()


async def test_turn_timeout_counts_as_a_failure(pool: EnvPool, tokenizer: Any) -> None:
    sim = engine(tokenizer, latency_s=5.0)
    cfg = config(turn_timeout_s=0.05, episode_retries=0, max_failed_groups_in_a_row=2)
    scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
    try:
        with pytest.raises(RuntimeError, match="TimeoutError"):
            await scheduler.get_batch()
    finally:
        await scheduler.close()


async def test_env_server_killed_mid_rollout_fails_over_to_another_endpoint(env_server: Any, tokenizer: Any) -> None:
    from env_servers.server import EnvServer, ServerConfig

    doomed = EnvServer.run_in_thread(ServerConfig(env_ids=("slow",), port=0))
    async with EnvPool([doomed.address, env_server.address], health_interval_s=0.1, call_timeout_s=2) as pool:
        cfg = config(env_id="slow", env_config={"max_steps": 4, "delay_s": 0.02}, batch_size=8, episode_retries=3)
        scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, cfg)
        try:
            task = asyncio.create_task(scheduler.get_batch())
            await asyncio.sleep(0.15)
            doomed.stop(grace=0)
            batch = await asyncio.wait_for(task, 60)
        finally:
            await scheduler.close()
    assert sorted(Counter(batch.traj_group_id).values()) == [2, 2, 2, 2]
    assert set(batch.step.tolist()) == {4}


async def test_suspend_holds_generation_until_resume(pool: EnvPool, tokenizer: Any) -> None:
    sim = engine(tokenizer)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config())
    try:
        await scheduler.suspend()
        task = asyncio.create_task(scheduler.get_batch())
        await asyncio.sleep(0.3)
        assert sim.stats()["requests"] == 0 and not task.done()
        await scheduler.resume()
        batch = await asyncio.wait_for(task, 30)
    finally:
        await scheduler.close()
    assert len(batch) == 4


async def test_resume_from_state_neither_repeats_nor_skips_groups(pool: EnvPool, tokenizer: Any) -> None:
    cfg = config(max_staleness=1)  # runs ahead: some started groups are unconsumed at the checkpoint
    straight = RolloutScheduler(pool, engine(tokenizer), tokenizer, cfg)
    try:
        expected = [sorted(set((await straight.get_batch()).traj_group_id)) for _ in range(3)]
    finally:
        await straight.close()
    first = RolloutScheduler(pool, engine(tokenizer), tokenizer, cfg)
    try:
        seen = [sorted(set((await first.get_batch()).traj_group_id))]
        state = first.state_dict()
    finally:
        await first.close()
    resumed = RolloutScheduler(pool, engine(tokenizer), tokenizer, cfg)
    resumed.load_state_dict(state)
    try:
        seen += [sorted(set((await resumed.get_batch()).traj_group_id)) for _ in range(2)]
    finally:
        await resumed.close()
    flat = [g for batch in seen for g in batch]
    assert len(flat) == len(set(flat)) == 6
    assert set(flat) == {g for batch in expected for g in batch}
    with pytest.raises(ValueError, match="seed"):
        RolloutScheduler(pool, engine(tokenizer), tokenizer, config(seed=5)).load_state_dict(state)


async def test_ranks_play_disjoint_groups(pool: EnvPool, tokenizer: Any) -> None:
    batches = []
    for rank in range(2):
        scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(), rank=rank, world_size=2)
        try:
            batches.append(set((await scheduler.get_batch()).traj_group_id))
        finally:
            await scheduler.close()
    assert not batches[0] & batches[1]
    assert {g.split("/")[1] for g in batches[0]} == {"g0", "g2"}


class KeyedEngine(SimulatedEngine):
    """`SimulatedEngine` (a scheduling stand-in) whose reply depends only on the conversation and its turn, not on
    the order requests arrive in: async and lock-step collection then play the very same moves."""

    async def generate(self, prompt_ids: Any, params: SamplingParams, *, key: str = "") -> Any:
        self._rng.seed(zlib.crc32(f"{key}/{len(prompt_ids)}".encode()))
        return await super().generate(prompt_ids, params, key=key)


@pytest.mark.parametrize("layout", ["trajectory", "step"])
async def test_lockstep_mode_plays_the_same_groups_as_async(pool: EnvPool, tokenizer: Any, layout: str) -> None:
    episode = EpisodeSettings(layout=layout, max_turns=3, max_context_tokens=2048)  # type: ignore[arg-type]
    results = {}
    for mode in ("async", "lockstep"):
        keyed = KeyedEngine(tokenizer, MOVES, latency_s=0.005)
        scheduler = RolloutScheduler(pool, keyed, tokenizer, config(mode=mode, episode=episode))
        try:
            batch = await scheduler.get_batch()
        finally:
            await scheduler.close()
        results[mode] = (sorted(batch.traj_group_id), first_observations(batch))
    assert results["async"] == results["lockstep"]
    if layout == "step":
        assert len(results["async"][0]) == 4 * 3  # one row per turn


async def test_a_context_budget_smaller_than_the_first_prompt_is_a_clear_error(pool: EnvPool, tokenizer: Any) -> None:
    episode = EpisodeSettings(max_context_tokens=40, sampling=SamplingParams(max_new_tokens=8))
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(episode=episode))
    try:
        with pytest.raises(ContextBudgetError, match="max_context_tokens=40"):
            await asyncio.wait_for(scheduler.get_batch(), 30)
    finally:
        await scheduler.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 5, "group_size": 2}, "batch_size=5 is not divisible by data.rollout.group_size=2"),
        ({"group_size": 0}, "group_size must be >= 1"),
        ({"mode": "sometimes"}, "rollout.mode"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"episode": EpisodeSettings(max_context_tokens=64, sampling=SamplingParams(max_new_tokens=64))}, "one turn"),
    ],
)
def test_bad_rollout_settings_name_the_key(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(RolloutConfigError, match=message):
        config(**overrides)


async def test_an_env_config_the_servers_refuse_fails_fast_naming_the_key(pool: EnvPool, tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config(env_config={"dim_rooom": 6}))
    try:
        with pytest.raises(RolloutConfigError, match="rollout.env_config.*dim_rooom"):
            await asyncio.wait_for(scheduler.get_batch(), 30)
    finally:
        await scheduler.close()


async def test_a_simulated_engine_with_a_callable_latency_draws_one_per_reply(tokenizer: Any) -> None:
    """The scheduling benchmarks' uneven replies: ``latency_s`` may be a callable, asked once per reply."""
    drawn: list[int] = []

    def draw() -> float:
        drawn.append(len(drawn))
        return 0.001

    sim = SimulatedEngine(tokenizer, MOVES, latency_s=draw)
    replies = [await sim.generate([1, 2], SamplingParams(max_new_tokens=4)) for _ in range(3)]
    assert drawn == [0, 1, 2] and all(r.token_ids for r in replies)
    assert sim.stats()["requests"] == 3
