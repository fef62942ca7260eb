"""Branching rollouts (``data.rollout.branch``, issue 49) with the real tiny model and real env servers: a spine
forks its session and conversation before branch turns, and each copy is a member of the group that continues on
its own. Every trained token is in exactly one row (a copy's row holds the turns before its fork as prompt only),
the engine's log-probs are the trainer's, the spine's step and its copies' first steps share one exact state, and
a copy's return counts the spine's rewards before the fork."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import support.fork_envs  # noqa: F401  (registers trail-fixed)
from support.servers import start_server
from support.tiny_rollout import one_batch, recomputed_logprobs

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutConfigError, RolloutScheduler
from roll_lightning.rollout.config.branching import BranchSettings
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

TEMPERATURE = 1.0


def config(layout: str, **overrides: Any) -> RolloutConfig:
    episode = EpisodeSettings(
        layout=layout,  # type: ignore[arg-type]
        max_turns=4,
        max_context_tokens=2048,
        sampling=SamplingParams(max_new_tokens=8, temperature=TEMPERATURE),
    )
    base: dict[str, Any] = {
        "env_id": "frozenlake",
        "env_config": {"is_slippery": True, "max_steps": 4, "lenient": True},
        "group_size": 4,
        "batch_size": 8,
        "episode": episode,
        "branch": BranchSettings(every=1, width=2),
    }
    return RolloutConfig(**{**base, **overrides})


@pytest.mark.parametrize("layout", ["trajectory", "step"])
async def test_forked_members_continue_the_spine_and_every_token_trains_once(
    pool: EnvPool, model_dir: Path, tokenizer: Any, layout: str
) -> None:
    batch = await one_batch(pool, model_dir, tokenizer, config(layout), seed=3)
    groups: dict[str, list[Any]] = defaultdict(list)
    for episode in batch.episodes:
        groups[episode.group_key].append(episode)
    copies = 0
    for members in groups.values():
        assert sorted(ep.member for ep in members) == [0, 1, 2, 3]
        spine = next(ep for ep in members if ep.member == 0)
        assert spine.branch is None
        for copy in (ep for ep in members if ep.branch is not None):
            copies += 1
            turn = copy.branch.turn
            assert copy.branch.parent == f"{spine.traj_key}#{spine.attempts}" and 1 <= turn < len(spine.turns) + 1
            assert copy.branch.prefix_return == pytest.approx(sum(t.reward for t in spine.turns[:turn]))
            assert copy.score == pytest.approx(copy.branch.prefix_return + sum(t.reward for t in copy.turns))
            assert copy.first_turn == turn
            # one exact state: the spine's step at the fork and the copy's first share it (and saw the same board)
            assert copy.turns[0].anchor == spine.turns[turn].anchor == f"fork {spine.traj_key}#1@{turn}"
            assert copy.turns[0].observation == spine.turns[turn].observation
            if layout == "trajectory":  # its one row: the conversation up to the fork, as prompt, then its turns
                before = [i for t in spine.turns[:turn] for i in t.prompt_ids + t.response_ids]
                assert copy.turns[0].prompt_ids[: len(before)] == before
    assert copies >= 1 and batch.metrics["rollout/branches_per_group"] == copies / 2
    assert batch.metrics["env/fork_latency_s"] > 0
    # every reply token is the engine's, and trains once: the rows' reply tokens are the episodes' own turns
    mask = batch.response_mask
    assert int(mask.sum()) == sum(len(t.response_ids) for ep in batch.episodes for t in ep.turns)
    gap = (recomputed_logprobs(model_dir, batch, TEMPERATURE) - batch.behaviour_logprobs)[mask].abs()
    assert gap.max() < 1e-3, f"trainer vs engine log-prob gap {gap.max():.2e}"
    if layout == "step":  # a row's step is the turn's index in the whole episode
        by_traj = defaultdict(list)
        for traj, step in zip(batch.traj_id, batch.step.tolist(), strict=True):
            by_traj[traj].append(step)
        for episode in batch.episodes:
            assert by_traj[episode.traj_key] == list(range(episode.first_turn, episode.first_turn + len(episode.turns)))


async def test_an_env_that_cannot_fork_stops_the_run_in_one_line(model_dir: Path, tokenizer: Any) -> None:
    running = start_server(env_ids=("trail-fixed",))
    try:
        async with EnvPool([running.address]) as pool:
            cfg = config("step", env_id="trail-fixed", env_config={})
            with pytest.raises(RolloutConfigError) as refused:
                await one_batch(pool, model_dir, tokenizer, cfg)
    finally:
        running.stop()
    assert str(refused.value) == (
        "data.rollout.branch needs a forkable env: env 'trail-fixed' cannot be forked: its spec says forkable: false"
    )


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"branch": {"every": 1, "spines": 4}}, "its spines (4) leave no member of a group of 4 for copies"),
        ({"mode": "lockstep"}, "it needs data.rollout.mode: async"),
        ({"group_redundancy": 1}, "it cannot be combined with data.rollout.group_redundancy"),
        ({"branch": {"width": 1, "every": 1}}, "data.rollout.branch.width must be >= 2, got 1"),
    ],
)
def test_branch_settings_that_cannot_work_are_refused_by_name(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(RolloutConfigError) as refused:
        config("step", **overrides)
    assert words in str(refused.value)


async def test_branching_keeps_groups_whole_across_envs_filters_and_staleness(
    pool: EnvPool, model_dir: Path, tokenizer: Any
) -> None:
    """Two envs in one batch, flat groups filtered out and refilled, one version of run-ahead: every batch still
    holds whole groups of four distinct members, each member's rows once, forks in both envs."""
    from roll_lightning.rollout.groups.filters import GroupFilterConfig

    envs = [
        {"tag": "lake", "env_id": "frozenlake", "env_config": {"is_slippery": True, "max_steps": 4, "lenient": True}},
        {"tag": "boxes", "env_id": "sokoban", "env_config": {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 4}},
    ]
    cfg = config(
        "step", env_id=None, env_config={}, envs=envs, max_staleness=1,
        group_filter=GroupFilterConfig(kind="zero_variance"),
    )  # fmt: skip
    engine = TransformersEngine(model_dir, seed=5)
    scheduler = RolloutScheduler(pool, engine, tokenizer, cfg)
    try:
        batches = [await scheduler.get_batch() for _ in range(2)]
    finally:
        await scheduler.close()
        await engine.close()
    seen: set[str] = set()
    for batch in batches:
        members: dict[str, set[int]] = defaultdict(set)
        for episode in batch.episodes:
            members[episode.group_key].add(episode.member)
            assert episode.traj_key not in seen  # no member is trained twice
            seen.add(episode.traj_key)
        assert sorted(map(sorted, members.values())) == [[0, 1, 2, 3]] * 2
        assert {key.split("/")[0] for key in members} == {"lake", "boxes"}
        assert len(set(zip(batch.traj_id, batch.step.tolist(), strict=True))) == len(batch)  # each row once
    assert any(ep.branch is not None for batch in batches for ep in batch.episodes if ep.tag == "boxes")


def test_the_branch_rules_name_their_turns() -> None:
    assert [t for t in range(7) if BranchSettings(every=2).forks_before(t)] == [2, 4, 6]
    assert [t for t in range(7) if BranchSettings(at=(1, 5)).forks_before(t)] == [1, 5]
    unsure = BranchSettings(surprise=2.0)
    assert unsure.forks_before(1, [-3.0, -1.5]) and not unsure.forks_before(1, [-0.2, -0.1])
    assert not unsure.forks_before(0, [-9.0]) and not BranchSettings().on


@pytest.mark.parametrize(("surprise", "forks"), [(1e-6, True), (1e6, False)])
async def test_a_surprise_rule_forks_after_unsure_replies_and_unforked_members_play_from_the_reset(
    pool: EnvPool, model_dir: Path, tokenizer: Any, surprise: float, forks: bool
) -> None:
    batch = await one_batch(pool, model_dir, tokenizer, config("step", branch=BranchSettings(surprise=surprise)))
    assert (batch.metrics["rollout/branches_per_group"] > 0) == forks
    members: dict[str, list[int]] = defaultdict(list)
    for episode in batch.episodes:
        members[episode.group_key].append(episode.member)
        assert (episode.branch is not None) <= forks
    assert sorted(map(sorted, members.values())) == [[0, 1, 2, 3]] * 2  # whole groups either way


async def test_copies_sessions_are_closed_after_their_episode(pool: EnvPool, model_dir: Path, tokenizer: Any) -> None:
    """Forks make sessions; once their episodes end they are closed, so the sessions a run holds stay as many as
    the episodes it plays at once however many batches it plays (before: +1 idle session per copy, until a
    server of 4,096 was full)."""
    engine = TransformersEngine(model_dir, seed=2)
    scheduler = RolloutScheduler(pool, engine, tokenizer, config("step", branch=BranchSettings(every=1, width=4)))
    try:
        copies = 0
        for _ in range(4):
            batch = await scheduler.get_batch()
            copies += int(batch.metrics["rollout/branches_per_group"] * 2)
        await asyncio.sleep(0.2)  # the closes run in the background
        held = len(scheduler.lanes[0].idle_sessions)
        active = (await pool.endpoints[0].client.server_info()).active_sessions
    finally:
        await scheduler.close()
        await engine.close()
    assert copies >= 8
    assert held <= 8 and active <= 8, f"{held} idle sessions, {active} open on the server after {copies} copies"


async def test_a_fork_the_server_refuses_leaves_the_spine_playing_and_the_group_whole(
    model_dir: Path, tokenizer: Any
) -> None:
    """A server with room for three sessions cannot take three copies beside the spine: the fork is refused
    (counted), the spine plays on, and the members play from the reset once it ends."""
    running = start_server(env_ids=("frozenlake",), max_sessions=3)
    try:
        async with EnvPool([running.address]) as small:
            cfg = config("step", batch_size=4, branch=BranchSettings(at=(1,), width=4))
            batch = await one_batch(small, model_dir, tokenizer, cfg)
    finally:
        running.stop()
    assert batch.metrics["env/forks_refused"] == 1 and batch.metrics["rollout/branches_per_group"] == 0
    assert sorted(ep.member for ep in batch.episodes) == [0, 1, 2, 3]
    assert all(ep.branch is None for ep in batch.episodes)
