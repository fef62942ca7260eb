"""Dynamic sampling: group filters, refills within a bound, and their bookkeeping.

The selection rules are tested on hand-built groups (pure logic, with hypothesis); the scheduler tests use real
env servers on 127.0.0.1 and `SimulatedEngine` (they are about scheduling). `slow` (tests/support/plugin_envs)
rewards every reply with 1.0, so every group it plays is flat: the case where nothing carries signal.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutConfigError, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine
from roll_lightning.rollout.episodes.episode import Episode, Turn
from roll_lightning.rollout.groups.filters import GROUP_FILTERS, FilterKind, GroupFilterConfig, GroupSelection, spread
from roll_lightning.rollout.groups.queue import Group

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]


def group(index: int, member_scores: list[float]) -> Group:
    g = Group(index, seed=index, size=len(member_scores), started_version=0)
    for member, score in enumerate(member_scores):
        turn = Turn([1], [2], [0.0], "stop", 0, "obs", reward=score)
        g.episodes.append(Episode(index, member, index, "test", turns=[turn]))
    return g


def collect(config: GroupFilterConfig, needed: int, stream: list[list[float]]) -> tuple[GroupSelection, int]:
    """Offer groups from ``stream`` while the selection misses some; returns it and how many it took."""
    selection = GroupSelection(config.build(), needed)
    taken = 0
    while selection.missing and taken < len(stream):
        selection.offer(group(taken, stream[taken]))
        taken += 1
    return selection, taken


def test_zero_variance_keeps_groups_with_signal_and_replaces_flat_ones() -> None:
    stream = [[1, 1], [0, 1], [2, 2], [0, 0.5], [3, 3]]
    selection, taken = collect(GroupFilterConfig("zero_variance", max_extra_groups=5), 2, stream)
    chosen, filtered, metrics = selection.result()
    assert taken == 4 and [g.index for g in chosen] == [1, 3] and [g.index for g in filtered] == [0, 2]
    assert metrics["rollout/groups_filtered"] == 2 and metrics["rollout/extra_groups"] == 2
    assert metrics["rollout/flat_group_share_before_filter"] == 0.5 and metrics["rollout/flat_group_share"] == 0


def test_zero_variance_bound_completes_the_batch_with_the_least_flat_groups() -> None:
    """Nothing passes (tolerance 0.2): after 1 + 3 extra groups the batch is completed from the rejected ones,
    largest spread first; it never waits for more."""
    stream = [[1, 1], [0, 0.1], [2, 2.15], [5, 5], [0, 9]]
    cfg = GroupFilterConfig("zero_variance", tolerance=0.2, max_extra_groups=3)
    selection, taken = collect(cfg, 1, stream)
    chosen, filtered, metrics = selection.result()
    assert taken == 4 and selection.missing == 0
    assert [g.index for g in chosen] == [2] and sorted(g.index for g in filtered) == [0, 1, 3]
    assert metrics["rollout/extra_groups"] == 3 and metrics["rollout/flat_group_share"] == 1.0


def test_without_a_filter_only_the_flat_share_is_reported() -> None:
    """No always-zero counters: ``kind: none`` filters nothing and plays nothing extra, so it says only that."""
    selection, _ = collect(GroupFilterConfig("none"), 2, [[1, 1], [0, 1]])
    chosen, filtered, metrics = selection.result()
    assert [g.index for g in chosen] == [0, 1] and filtered == []
    assert metrics == {"rollout/flat_group_share": 0.5}


def test_top_p_variance_over_samples_and_keeps_the_largest_spread() -> None:
    stream = [[0, 0], [0, 4], [1, 2], [0, 0], [7, 7], [0, 10]]
    selection, taken = collect(GroupFilterConfig("top_p_variance", keep_fraction=0.5), 3, stream)
    chosen, filtered, metrics = selection.result()
    assert taken == 6
    assert [g.index for g in chosen] == [5, 1, 2] and metrics["rollout/groups_filtered"] == 3


@given(
    kind=st.sampled_from(["none", "zero_variance", "top_p_variance"]),
    needed=st.integers(1, 6),
    max_extra=st.integers(0, 6),
    keep_fraction=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    stream=st.lists(st.lists(st.sampled_from([0.0, 1.0, 2.5]), min_size=2, max_size=2), min_size=60, max_size=60),
)
def test_every_selection_ends_with_exactly_the_groups_needed(
    kind: str, needed: int, max_extra: int, keep_fraction: float, stream: list[list[float]]
) -> None:
    cfg = GroupFilterConfig(kind, max_extra_groups=max_extra, keep_fraction=keep_fraction)  # type: ignore[arg-type]
    selection, taken = collect(cfg, needed, stream)
    chosen, filtered, metrics = selection.result()
    assert selection.missing == 0, "a bounded stream always completes the selection"
    assert len(chosen) == needed and len(chosen) + len(filtered) == taken
    assert taken <= selection.target + max_extra
    if kind == "zero_variance" and any(spread(g) > 0 for g in filtered):
        assert all(spread(g) > 0 for g in chosen), "a flat group is kept only when nothing better was played"


def test_each_kind_is_one_registry_entry_built_with_its_own_keys() -> None:
    assert set(get_args(FilterKind)) == set(GROUP_FILTERS)
    for kind, cls in GROUP_FILTERS.items():
        assert type(GroupFilterConfig(kind).build()) is cls
    zero = GroupFilterConfig("zero_variance", tolerance=0.5, max_extra_groups=3).build()
    top = GroupFilterConfig("top_p_variance", tolerance=0.5, keep_fraction=0.25).build()
    assert (zero.tolerance, zero.max_extra(8), zero.to_play(8)) == (0.5, 3, 8)
    assert (top.tolerance, top.max_extra(8), top.to_play(8)) == (0.5, 0, 32)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"kind": "zero_variance", "group_size": 1},
            "data.rollout.group_filter.kind=zero_variance compares the members",
        ),
        ({"kind": "top_p_variance", "keep_fraction": 0.0}, r"group_filter.keep_fraction must be in \(0, 1\]"),
        ({"kind": "top_p_variance", "keep_fraction": 1.5}, r"group_filter.keep_fraction must be in \(0, 1\]"),
        ({"kind": "zero_variance", "max_extra_groups": -1}, "group_filter.max_extra_groups must be >= 0"),
        ({"kind": "zero_variance", "tolerance": -0.1}, "group_filter.tolerance must be >= 0"),
        ({"kind": "variance"}, "data.rollout.group_filter.kind must be one of none, zero_variance, top_p_variance"),
    ],
)
def test_impossible_filter_settings_name_the_key(overrides: dict[str, Any], message: str) -> None:
    group_size = overrides.pop("group_size", 2)
    with pytest.raises(RolloutConfigError, match=message):
        RolloutConfig(group_size=group_size, batch_size=2 * group_size, group_filter=GroupFilterConfig(**overrides))


def rollout_config(**overrides: Any) -> RolloutConfig:
    base: dict[str, Any] = {
        "env_id": "sokoban",
        "env_config": {"dim_room": [6, 6], "num_boxes": 1},
        "group_size": 4,
        "batch_size": 8,
        "concurrent_episodes": 16,
        "episode": EpisodeSettings(max_turns=4, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)),
    }
    return RolloutConfig(**{**base, **overrides})


def group_spreads(batch: Any) -> dict[str, float]:
    by_group: dict[str, list[float]] = defaultdict(list)
    for key, score in zip(batch.traj_group_id, batch.episode_scores.tolist(), strict=True):
        by_group[key].append(score)
    return {key: max(v) - min(v) for key, v in by_group.items()}


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_filtered_groups_never_reach_a_batch(pool: EnvPool, tokenizer: Any, mode: str) -> None:
    cfg = rollout_config(mode=mode, group_filter=GroupFilterConfig("zero_variance", max_extra_groups=200))
    scheduler = RolloutScheduler(pool, SimulatedEngine(tokenizer, MOVES, latency_s=0.002, seed=3), tokenizer, cfg)
    filtered = 0.0
    try:
        for _ in range(3):
            batch = await scheduler.get_batch()
            spreads = group_spreads(batch)
            assert len(spreads) == 2 and min(spreads.values()) > 1e-6, spreads
            filtered += batch.metrics["rollout/groups_filtered"]
            assert batch.metrics["rollout/flat_group_share"] == 0.0
    finally:
        await scheduler.close()
    assert filtered > 0, "random Sokoban moves give flat groups too: the filter had something to do"
    (state,) = scheduler.state_dict()["lanes"].values()  # every group played was settled: none left to replay
    assert state["watermark"] == state["next_local"] and not state["settled_above"]


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_the_bound_holds_when_every_group_is_flat(pool: EnvPool, tokenizer: Any, mode: str) -> None:
    cfg = rollout_config(
        mode=mode,
        env_id="slow",
        env_config={"max_steps": 2},
        group_filter=GroupFilterConfig("zero_variance", max_extra_groups=3),
    )
    scheduler = RolloutScheduler(pool, SimulatedEngine(tokenizer, ["go"], latency_s=0.002), tokenizer, cfg)
    try:
        for played in (5, 10):
            batch = await scheduler.get_batch()
            assert len(batch.episode_metrics) == 8, "the batch is completed, with flat groups"
            assert batch.metrics["rollout/groups_filtered"] == 3 and batch.metrics["rollout/extra_groups"] == 3
            assert batch.metrics["rollout/flat_group_share"] == 1.0
            assert scheduler.lanes[0].sequence.watermark == played, "2 + 3 groups per batch, all settled"
    finally:
        await scheduler.close()


async def test_top_p_variance_plays_more_groups_and_keeps_the_fraction(pool: EnvPool, tokenizer: Any) -> None:
    cfg = rollout_config(group_filter=GroupFilterConfig("top_p_variance", keep_fraction=0.25))
    scheduler = RolloutScheduler(pool, SimulatedEngine(tokenizer, MOVES, latency_s=0.002, seed=5), tokenizer, cfg)
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert len(group_spreads(batch)) == 2
    assert batch.metrics["rollout/groups_filtered"] == 6 and batch.metrics["rollout/extra_groups"] == 6
    assert scheduler.lanes[0].sequence.watermark == 8


async def test_refills_are_held_to_max_staleness_like_any_group(pool: EnvPool, tokenizer: Any) -> None:
    """Groups generated ahead under old weights are dropped as stale before the filter sees them (they neither
    fill the batch nor count against its bound); the refills that replace them are played at the new version."""
    cfg = rollout_config(
        env_id="slow",
        env_config={"max_steps": 2},
        max_staleness=1,
        group_filter=GroupFilterConfig("zero_variance", max_extra_groups=3),
    )
    sim = SimulatedEngine(tokenizer, ["go"], latency_s=0.002)
    scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
    try:
        await scheduler.get_batch()  # 2 + 3 groups; the producer then runs one batch ahead at version 0
        while scheduler.ready < 2:
            await asyncio.sleep(0.05)
        await scheduler.suspend()
        await sim.load_weights({}, version=2)  # those groups are now two versions old
        await scheduler.resume()
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert set(batch.policy_version.tolist()) == {2}
    assert batch.metrics["rollout/dropped_groups_stale_total"] == 2
    assert batch.metrics["rollout/groups_filtered"] == 3 and batch.metrics["rollout/extra_groups"] == 3
    (state,) = scheduler.state_dict()["lanes"].values()
    settled = state["watermark"] + len(state["settled_above"])
    assert settled == 5 + 2 + 5, "stale, filtered and kept groups are all settled (not those played ahead)"
