"""Several envs in one run (``rollout.envs``): exact per-tag batches, per-tag metrics, resume per tag and rank,
filters and staleness per tag, config validation naming the key, env ids routed to the servers that serve them.

Real env servers on 127.0.0.1: one serving only Sokoban, one only FrozenLake, each behind its own pool (as
per-env endpoints give). The engine is `SimulatedEngine`: these tests are about scheduling; the CLI tests
(tests/cli/test_multi_env.py) run the real model.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import torch
from support.servers import start_server

from env_servers.server import RunningServer
from roll_lightning.algorithms.gigpo import gigpo_advantages
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index
from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutConfigError, RolloutScheduler, group_seed
from roll_lightning.rollout.config.envs import salt
from roll_lightning.rollout.config.rollout import EnvsConfig, EvalConfig
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine
from roll_lightning.rollout.groups.filters import GroupFilterConfig
from roll_lightning.rollout.runtime.servers import EnvServers

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]
SOKOBAN = {"tag": "sokoban", "env_id": "sokoban", "env_config": {"dim_room": [6, 6], "num_boxes": 1}}
FROZENLAKE = {"tag": "frozenlake", "env_id": "frozenlake", "env_config": {"size": 4, "is_slippery": False}}
S2 = {**SOKOBAN, "groups": 2}


def config(sokoban_groups: int = 2, frozenlake_groups: int = 1, **overrides: Any) -> RolloutConfig:
    base: dict[str, Any] = {
        "envs": [{**SOKOBAN, "groups": sokoban_groups}, {**FROZENLAKE, "groups": frozenlake_groups}],
        "group_size": 2,
        "batch_size": 2 * (sokoban_groups + frozenlake_groups),
        "concurrent_episodes": 12,
        "episode": EpisodeSettings(max_turns=3, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)),
    }
    return RolloutConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def two_servers() -> Iterator[dict[str, RunningServer]]:
    servers = {"sokoban": start_server(env_ids=("sokoban",)), "frozenlake": start_server(env_ids=("frozenlake",))}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
async def pools(two_servers: dict[str, RunningServer]) -> AsyncIterator[dict[str, EnvPool]]:
    opened = {tag: EnvPool([server.address], health_interval_s=0.2) for tag, server in two_servers.items()}
    for pool in opened.values():
        await pool.start()
    yield opened
    for pool in opened.values():
        await pool.close()


def engine(tokenizer: Any, latency_s: float = 0.003, seed: int = 0) -> SimulatedEngine:
    return SimulatedEngine(tokenizer, MOVES, latency_s=latency_s, seed=seed)


def tags(batch: Any) -> list[str]:
    return [episode.tag for episode in batch.episodes]


def groups_by_tag(batch: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key in dict.fromkeys(batch.traj_group_id):  # first-seen order
        out.setdefault(key.split("/")[0], []).append(key)
    return out


async def test_every_batch_holds_each_tags_groups_in_config_order(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pools, engine(tokenizer), tokenizer, config(max_staleness=1))
    try:
        batches = [await scheduler.get_batch() for _ in range(3)]
    finally:
        await scheduler.close()
    for batch in batches:
        assert tags(batch) == ["sokoban"] * 4 + ["frozenlake"] * 2  # exact shares, in the list's order
        assert [e.env_id for e in batch.episodes] == ["sokoban"] * 4 + ["frozenlake"] * 2
        assert {len(v) for v in groups_by_tag(batch).values()} >= {1, 2} and len(groups_by_tag(batch)["sokoban"]) == 2
        assert batch.metrics["rollout/sokoban/episodes"] == 4 and batch.metrics["rollout/frozenlake/episodes"] == 2
        for tag in ("sokoban", "frozenlake"):
            mine = [m for m, e in zip(batch.episode_metrics, batch.episodes, strict=True) if e.tag == tag]
            assert batch.metrics[f"rollout/{tag}/success_rate"] == sum(m["success"] for m in mine) / len(mine)
            assert batch.metrics[f"env/{tag}/step_latency_s"] > 0
        assert batch.metrics["rollout/episodes"] == 6  # and the batch aggregate
    played = [g for batch in batches for g in batch.traj_group_id]
    assert len(set(played)) == 9  # no group twice across batches


async def test_each_env_is_played_on_its_own_servers(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    """A FrozenLake session on the Sokoban-only server would fail: the batch being whole says the routing held;
    the boards say which env played."""
    scheduler = RolloutScheduler(pools, engine(tokenizer), tokenizer, config())
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    for episode in batch.episodes:
        board = episode.turns[0].observation
        assert ("#" in board) == (episode.tag == "sokoban"), board  # Sokoban draws walls; FrozenLake does not


async def test_one_pool_routes_each_env_to_the_servers_that_serve_it(
    two_servers: dict[str, RunningServer], tokenizer: Any
) -> None:
    addresses = [server.address for server in two_servers.values()]
    async with EnvPool(addresses, health_interval_s=0.2) as pool:
        assert pool.served() == {two_servers[t].address: [t] for t in ("sokoban", "frozenlake")}
        scheduler = RolloutScheduler(pool, engine(tokenizer), tokenizer, config())
        try:
            batches = [await scheduler.get_batch() for _ in range(2)]
        finally:
            await scheduler.close()
        assert await pool.wait_serving("sokoban") and not await pool.wait_serving("webshop")
    assert all(tags(b) == ["sokoban"] * 4 + ["frozenlake"] * 2 for b in batches)
    assert scheduler.counters["episode_retries"] == 0  # no session was ever tried on the wrong server


async def test_a_group_filter_keeps_each_tags_share(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    cfg = config(3, 1, group_filter=GroupFilterConfig("zero_variance", max_extra_groups=4))
    scheduler = RolloutScheduler(pools, engine(tokenizer), tokenizer, cfg)
    try:
        batches = [await scheduler.get_batch() for _ in range(3)]
    finally:
        await scheduler.close()
    assert sum(b.metrics["rollout/groups_filtered"] for b in batches) > 0, "random moves give flat groups"
    for batch in batches:
        assert Counter(tags(batch)) == {"sokoban": 6, "frozenlake": 2}
    lanes = scheduler.state_dict()["lanes"]
    assert all(s["watermark"] == s["next_local"] for s in lanes.values()), "kept and filtered groups all settled"
    assert lanes["sokoban"]["next_local"] + lanes["frozenlake"]["next_local"] > 3 * 4  # refills were played


async def test_resume_replays_exactly_per_tag_and_per_rank(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    """Each tag's groups: none played twice, and none skipped (every group number started is played or still
    due to be replayed), on each rank, across a resume from state taken while groups ran ahead."""
    cfg = config(max_staleness=1)  # runs ahead: started groups of both tags are unconsumed at the checkpoint
    for rank in range(2):
        first = RolloutScheduler(pools, engine(tokenizer), tokenizer, cfg, rank=rank, world_size=2)
        try:
            seen = [groups_by_tag(await first.get_batch())]
            state = first.state_dict()
        finally:
            await first.close()
        assert set(state["lanes"]) == {"sokoban", "frozenlake"}
        assert any(s["next_local"] > s["watermark"] for s in state["lanes"].values()), "nothing ran ahead"
        resumed = RolloutScheduler(pools, engine(tokenizer), tokenizer, cfg, rank=rank, world_size=2)
        resumed.load_state_dict(state)
        try:
            seen += [groups_by_tag(await resumed.get_batch()) for _ in range(2)]
            final = resumed.state_dict()["lanes"]
        finally:
            await resumed.close()
        for tag, per_batch in (("sokoban", 2), ("frozenlake", 1)):
            played = [int(g.split("/")[1][1:]) for batch in seen for g in batch[tag]]
            assert all(len(batch[tag]) == per_batch for batch in seen)
            assert len(played) == len(set(played)) == 3 * per_batch  # none played twice
            assert all(index % 2 == rank for index in played)  # this rank's groups only
            lane = final[tag]
            due = {i for i in range(lane["watermark"], lane["next_local"]) if i not in lane["settled_above"]}
            assert {i // 2 for i in played} | due == set(range(lane["next_local"])), "a started group was skipped"
    only_one = config(4, 0, envs=[{**SOKOBAN, "groups": 4}])
    scheduler = RolloutScheduler(pools, engine(tokenizer), tokenizer, only_one, rank=1, world_size=2)
    with pytest.raises(ValueError, match=r"saved for the envs \['frozenlake', 'sokoban'\]; this run plays"):
        scheduler.load_state_dict(state)


async def test_lockstep_mode_holds_each_tags_share_too(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    scheduler = RolloutScheduler(pools, engine(tokenizer), tokenizer, config(mode="lockstep"))
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert tags(batch) == ["sokoban"] * 4 + ["frozenlake"] * 2


async def test_per_env_episode_settings_apply_to_that_env_only(pools: dict[str, EnvPool], tokenizer: Any) -> None:
    cfg = config(
        envs=[{**SOKOBAN, "groups": 2, "episode": {"max_turns": 1}}, {**FROZENLAKE, "groups": 1}],
        episode=EpisodeSettings(max_turns=3, sampling=SamplingParams(max_new_tokens=16)),
    )
    assert [lane.episode.max_turns for lane in cfg.lanes] == [1, 3]
    scheduler = RolloutScheduler(pools, SimulatedEngine(tokenizer, ["no move"]), tokenizer, cfg)
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    turns = {tag: {len(e.turns) for e in batch.episodes if e.tag == tag} for tag in ("sokoban", "frozenlake")}
    assert turns == {"sokoban": {1}, "frozenlake": {3}}  # invalid replies never end an episode early


def test_each_tag_has_its_own_seeds_and_the_single_env_form_keeps_its_own() -> None:
    assert group_seed(0, 5, salt=salt("a")) != group_seed(0, 5, salt=salt("b"))
    assert group_seed(0, 5, "eval", salt("a")) % 2 == 1 and group_seed(0, 5, "train", salt("a")) % 2 == 0
    single = RolloutConfig(env_id="sokoban", group_size=2, batch_size=4)
    assert single.lanes[0].seed_salt is None and not single.tagged  # the seeds runs before tags played


def test_gigpo_step_groups_never_span_two_envs() -> None:
    """Two envs' episodes with the same group number, seed and board still sit in different step groups: the
    group key starts with the tag."""
    from roll_lightning.rollout.episodes.episode import Episode

    a, b = (Episode(0, 0, 7, "sokoban", tag=t) for t in ("six", "seven"))
    assert a.group_key != b.group_key

    def advantages(keys: list[str], scores: list[float]) -> torch.Tensor:
        n = len(keys)
        return gigpo_advantages(
            episode_scores=torch.tensor(scores), step_rewards=torch.tensor(scores), group_ids=ids_to_index(keys),
            traj_ids=torch.arange(n), step_index=torch.zeros(n, dtype=torch.long),
            anchors=anchor_ids(["the same board"] * n), gamma=1.0,
        )  # fmt: skip

    mixed = advantages([a.group_key] * 2 + [b.group_key] * 2, [1.0, 0.0, 5.0, 5.0])
    alone = advantages([a.group_key] * 2, [1.0, 0.0])
    assert torch.allclose(mixed[:2], alone) and torch.all(mixed[2:] == 0)  # the other env's rows changed nothing


STEP = EpisodeSettings(layout="step", max_turns=2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"envs": [S2, {**SOKOBAN, "groups": 1}]}, r"envs\[1\]\.tag='sokoban' is also data\.rollout\.envs\[0\]'s"),
        ({"envs": [S2, {**FROZENLAKE, "groups": 2}]}, r"groups per batch \(2 \+ 2 = 4\) must sum to .* = 3"),
        ({"envs": [{**SOKOBAN, "groups": 2}, FROZENLAKE]}, r"rollout\.envs\[1\]: no 'groups'"),
        ({"envs": [SOKOBAN, FROZENLAKE]}, r"3 groups per batch do not split evenly over 2 envs"),
        ({"envs": [{**SOKOBAN, "groups": 3, "tag": "so koban"}]}, r"rollout\.envs\[0\]\.tag='so koban'"),
        ({"env_id": "sokoban"}, r"rollout\.env_id/env_config and data\.rollout\.envs are both set"),
        ({"envs": [{**SOKOBAN, "groups": 2, "episode": {"max_turn": 3}}, {**FROZENLAKE, "groups": 1}]},
         r"rollout\.envs\[0\]\.episode\.max_turn: no such key"),
        ({"envs": [{**SOKOBAN, "groups": 2, "episode": {"layout": "step"}}, {**FROZENLAKE, "groups": 1}]},
         r"rollout\.envs\[0\]\.episode\.layout='step' differs from data\.rollout\.episode\.layout='trajectory'"),
        ({"envs": [{**SOKOBAN, "groups": 2}, {**FROZENLAKE, "groups": 1, "episode": {"max_context_tokens": 16}}]},
         r"rollout\.envs\[1\]\.episode\.max_context_tokens=16 leaves no room .*max_new_tokens=16"),
        ({"envs": [{**SOKOBAN, "groups": 2}, {**FROZENLAKE, "groups": 1, "episode": {"sampling": {"top_p": 0}}}]},
         r"rollout\.envs\[1\]\.episode\.sampling: top_p must be in \(0, 1\]"),
        ({"envs": [{**SOKOBAN, "groups": 2, "endpoints": ["nowhere"]}, {**FROZENLAKE, "groups": 1}]},
         r"rollout\.envs\[0\]\.endpoints: 'nowhere' is not host:port"),
        ({"envs": [{**SOKOBAN, "groups": 2}, {**FROZENLAKE, "groupz": 1}]}, r"rollout\.envs\[1\]: .*'groupz'"),
        ({"envs": [S2, {"tag": "mine", "env_id": "agent", "groups": 1, "agent": {"command": ["x"]}}]},
         r"rollout\.envs\[1\]\.agent: an agent's calls train as step rows"),
        ({"envs": [S2, {"tag": "mine", "env_id": "agent", "groups": 1, "agent": {"deadline_s": 5}}], "episode": STEP},
         r"rollout\.envs\[1\]\.agent: agent\.command must be a non-empty list"),
        ({"envs": [S2, {"tag": "mine", "env_id": "agent", "groups": 1, "agent": {"command": ["x"], "wait": 1}}],
          "episode": STEP},
         r"rollout\.envs\[1\]\.agent: .*'wait'"),
        ({"envs": [S2, {"tag": "mine", "env_id": "agent", "groups": 1, "agent": ["x"]}]},
         r"rollout\.envs\[1\]\.agent must be a mapping"),
    ],
    ids=[
        "duplicate-tags", "partition-sum", "some-groups-missing", "uneven-split", "bad-tag", "env-id-and-envs",
        "unknown-episode-key", "mixed-layouts", "context-budget", "bad-sampling", "bad-endpoint", "unknown-entry-key",
        "agent-trajectory-rows", "agent-no-command", "agent-unknown-key", "agent-not-a-mapping",
    ],
)  # fmt: skip
def test_an_impossible_env_list_is_refused_naming_the_key(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(RolloutConfigError, match=message):
        config(**overrides)


def test_an_impossible_evaluation_list_is_refused_naming_its_key() -> None:
    train = config()
    with pytest.raises(RolloutConfigError, match=r"data\.evaluation\.envs\[1\]\.tag='a' is also"):
        EvalConfig(envs=[{**SOKOBAN, "tag": "a"}, {**FROZENLAKE, "tag": "a"}]).rollout(train)  # type: ignore[list-item]
    with pytest.raises(RolloutConfigError, match=r"data\.evaluation\.envs\[0\]\.episodes must be >= 1"):
        EvalConfig(envs=[{**SOKOBAN, "episodes": 0}])  # type: ignore[list-item]
    held_out = EvalConfig(episodes=5, envs=[{**SOKOBAN, "tag": "six"}, {**SOKOBAN, "tag": "seven", "episodes": 3,
                          "env_config": {"dim_room": [7, 7]}}]).rollout(train)  # type: ignore[list-item]  # fmt: skip
    assert [(lane.tag, lane.groups) for lane in held_out.lanes] == [("six", 5), ("seven", 3)]
    assert held_out.batch_size == 8 and held_out.group_size == 1
    default = EvalConfig(episodes=4).rollout(train)  # no list: each training env, `episodes` starts each
    assert [(lane.tag, lane.groups) for lane in default.lanes] == [("sokoban", 4), ("frozenlake", 4)]


async def test_an_env_id_no_endpoint_serves_is_named_before_a_model_loads(
    two_servers: dict[str, RunningServer], tokenizer: Any
) -> None:
    cfg = config(envs=[{**SOKOBAN, "groups": 2}, {**FROZENLAKE, "groups": 1}])
    servers = EnvServers(EnvsConfig(endpoints=[two_servers["sokoban"].address]), list(cfg.lanes))
    with pytest.raises(RolloutConfigError) as err:
        await servers.start(tokenizer)
    address = two_servers["sokoban"].address
    expected = f"data.rollout.envs[1].env_id='frozenlake': no endpoint of data.envs.endpoints=['{address}'] serves it"
    assert expected in str(err.value)
    assert "sokoban" in str(err.value)  # what they do serve


async def test_a_per_env_budget_the_first_prompt_does_not_fit_is_named(
    two_servers: dict[str, RunningServer], tokenizer: Any
) -> None:
    frozen = {**FROZENLAKE, "groups": 1, "endpoints": [two_servers["frozenlake"].address]}
    tight = {**frozen, "episode": {"max_context_tokens": 18}}  # more than the reply's 16, less than any board
    cfg = config(envs=[{**SOKOBAN, "groups": 2}, tight])
    servers = EnvServers(EnvsConfig(endpoints=[two_servers["sokoban"].address]), list(cfg.lanes))
    with pytest.raises(RolloutConfigError, match=r"data\.rollout\.envs\[1\]\.episode\.max_context_tokens: "):
        await servers.start(tokenizer)
    lanes = list(config(envs=[S2, frozen]).lanes)
    fine = EnvServers(EnvsConfig(endpoints=[two_servers["sokoban"].address]), lanes)
    await fine.start(tokenizer)
    try:
        assert len(fine.pools) == 2  # the run's endpoints, and FrozenLake's own
    finally:
        await fine.close()


async def test_failed_episodes_are_replayed_within_their_tags_share(
    two_servers: dict[str, RunningServer], tokenizer: Any
) -> None:
    """``crashy`` fails every episode that says "crash"; its retries and dropped groups stay in its tag."""
    server = start_server(env_ids=("crashy", "frozenlake"))
    try:
        async with EnvPool([server.address], health_interval_s=0.2) as pool:
            cfg = config(
                envs=[
                    {"tag": "crashy", "env_id": "crashy", "env_config": {"max_steps": 2}, "groups": 2},
                    {**FROZENLAKE, "groups": 1},
                ],
                episode_retries=3,
                retry_backoff_s=0.0,
                max_failed_groups_in_a_row=50,
            )
            sim = SimulatedEngine(tokenizer, ["crash", "go", "go", "go"], latency_s=0.001, seed=3)
            scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
            try:
                batches = [await asyncio.wait_for(scheduler.get_batch(), 120) for _ in range(2)]
            finally:
                await scheduler.close()
    finally:
        server.stop()
    assert scheduler.counters["episode_retries"] > 0
    for batch in batches:
        assert tags(batch) == ["crashy"] * 4 + ["frozenlake"] * 2


def test_the_documented_multi_env_example_is_a_config_that_works() -> None:
    import re
    import textwrap
    from pathlib import Path

    import yaml

    page = (Path(__file__).resolve().parents[2] / "docs" / "training.md").read_text()
    block = re.search(r"```yaml\n(  data:\n.*?)  ```", page, re.S)
    assert block, "the multi-env example is missing from docs/training.md"
    data = yaml.safe_load(textwrap.dedent(block.group(1)))["data"]
    rollout = data["rollout"]
    train = RolloutConfig(**{**rollout, "episode": EpisodeSettings(**rollout["episode"])})
    assert [(lane.tag, lane.groups) for lane in train.lanes] == [("sokoban", 4), ("webshop", 4)]
    sokoban, webshop = (lane.episode for lane in train.lanes)
    assert (sokoban.max_turns, webshop.max_turns, webshop.sampling.max_new_tokens) == (10, 15, 64)
    assert train.lanes[1].endpoints == ("10.0.0.7:50051",) and train.lanes[0].endpoints is None
    held_out = EvalConfig(**data["evaluation"]).rollout(train)
    assert [(lane.tag, lane.groups, lane.env_config["dim_room"]) for lane in held_out.lanes] == [
        ("sokoban6", 128, [6, 6]),
        ("sokoban7", 64, [7, 7]),
    ]
