"""The scheduler's named parts, each on its own, without env servers: the generation gate, the failure policy,
the group ledger and the staleness rule. (The scheduler with real servers: test_scheduler.py and friends.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from roll_lightning.env_client import EpisodesKeepFailing
from roll_lightning.rollout import RolloutConfig
from roll_lightning.rollout.engines import Generation, SamplingParams
from roll_lightning.rollout.episodes.episode import Episode
from roll_lightning.rollout.groups.queue import Group, GroupQueue, is_stale
from roll_lightning.rollout.scheduling.failures import FailurePolicy
from roll_lightning.rollout.scheduling.gate import GenerationGate
from roll_lightning.rollout.scheduling.ledger import GroupLedger, group_seed

PARAMS = SamplingParams(max_new_tokens=4)


class HeldReplies:
    """A scheduling stand-in for an engine: each reply waits until the test releases it; counts the calls."""

    def __init__(self) -> None:
        self.policy_version = 0
        self.calls = 0
        self.release = asyncio.Event()

    async def generate(self, prompt_ids: Any, params: SamplingParams, *, key: str = "") -> Generation:
        self.calls += 1
        await self.release.wait()
        return Generation([1], [-0.5], "stop", self.policy_version)


@pytest.mark.parametrize("mode", ["wait", "abort"])
async def test_the_gate_holds_replies_and_aborts_or_waits(mode: str) -> None:
    engine = HeldReplies()
    counters: dict[str, float] = {}
    gate = GenerationGate(engine, mode, counters)  # type: ignore[arg-type]
    reply = asyncio.create_task(gate.generate([1, 2], PARAMS))
    while gate.generating == 0:
        await asyncio.sleep(0)
    closing = asyncio.create_task(gate.close())
    await asyncio.sleep(0.01)
    closed_at_once = closing.done()
    engine.policy_version = 1  # "new weights" while the gate is closed
    engine.release.set()
    await closing
    gate.open()
    generation = await reply
    assert closed_at_once == (mode == "abort")  # abort does not wait for the reply in flight
    if mode == "abort":
        assert counters["turns_aborted"] == 1 and engine.calls == 2
        assert generation.policy_version == 1 and generation.extra == {"redone": 1}
    else:
        assert counters["turns_aborted"] == 0 and engine.calls == 1
        assert generation.policy_version == 1 and generation.extra == {}


async def test_a_closed_gate_starts_no_reply_until_it_opens() -> None:
    engine = HeldReplies()
    engine.release.set()
    gate = GenerationGate(engine, "wait", {})  # type: ignore[arg-type]
    await gate.close()
    reply = asyncio.create_task(gate.generate([1], PARAMS))
    await asyncio.sleep(0.01)
    assert engine.calls == 0 and not gate.is_open
    gate.open()
    await reply
    assert engine.calls == 1


def test_the_failure_policy_backs_off_and_stops_after_failed_groups_in_a_row() -> None:
    stopped: list[BaseException] = []
    counters: dict[str, float] = {}
    policy = FailurePolicy(RolloutConfig(retry_backoff_s=1.0, max_failed_groups_in_a_row=3), counters, stopped.append)
    for failures in range(1, 8):
        expected = min(30.0, 2 ** (failures - 1))
        assert 0.5 * expected <= policy.backoff_s(failures) <= expected
    policy.group_dropped()
    policy.group_dropped()
    policy.group_completed()  # a complete group breaks the run of failures
    policy.group_dropped()
    policy.group_dropped()
    assert not stopped and counters["groups_failed_in_a_row"] == 2
    policy.group_dropped()
    assert len(stopped) == 1 and isinstance(stopped[0], EpisodesKeepFailing)
    assert "3 groups in a row" in str(stopped[0])


class _Lane:
    """The two fields of `LaneState` the ledger reads, around a real `GroupSequence`."""

    def __init__(self) -> None:
        from roll_lightning.rollout.scheduling.ledger import GroupSequence

        (self.spec,) = RolloutConfig(env_id="sokoban").lanes
        self.position = 0
        self.sequence = GroupSequence()

    @property
    def tag(self) -> str:
        return self.spec.tag


def test_the_ledger_replays_exactly_the_unsettled_groups_after_a_resume() -> None:
    lanes = [_Lane()]
    ledger = GroupLedger(lanes, seed=7, rank=1, world_size=2, split="train")  # type: ignore[arg-type]
    groups = [ledger.new_group(lanes[0], size=4, version=0) for _ in range(5)]  # type: ignore[arg-type]
    assert [g.index for g in groups] == [1, 3, 5, 7, 9]  # rank 1 of 2
    assert [g.seed for g in groups] == [group_seed(7, g.index, "train", lanes[0].spec.seed_salt) for g in groups]
    for group in (groups[0], groups[2]):
        ledger.settle(group)
    state = ledger.state_dict()
    fresh = [_Lane()]
    resumed = GroupLedger(fresh, seed=7, rank=1, world_size=2, split="train")  # type: ignore[arg-type]
    resumed.load_state_dict(state)
    again = [resumed.new_group(fresh[0], size=4, version=0).index for _ in range(4)]  # type: ignore[arg-type]
    assert again == [3, 7, 9, 11]  # the unsettled ones first, then on
    with pytest.raises(ValueError, match="saved with seed=7, world_size=2; this run has seed=8"):
        GroupLedger(fresh, seed=8, rank=1, world_size=2, split="train").load_state_dict(state)  # type: ignore[arg-type]


def test_one_staleness_rule_for_the_queue_and_the_batch() -> None:
    assert not is_stale(5, 5, 0) and is_stale(5, 4, 0)
    assert not is_stale(5, 3, 2) and is_stale(5, 2, 2)
    queue = GroupQueue(max_staleness=1)
    old, recent = Group(0, 0, 1, started_version=2), Group(1, 0, 1, started_version=3)
    queue.add(old)
    queue.add(recent)
    assert queue.expire(4) == [old] and list(queue.live) == [1]
    assert queue.counters["dropped_stale"] == 1


def _episode(group_index: int) -> Episode:
    return Episode(group_index=group_index, member=0, seed=0, env_id="frozenlake")


async def test_in_start_order_the_oldest_group_is_released_first_once_complete() -> None:
    """``staleness: admit``'s queue: a newer group that completes first waits behind the oldest one."""
    queue = GroupQueue(max_staleness=1, in_start_order=True)
    old, new = Group(0, 0, 1, started_version=0), Group(1, 0, 1, started_version=0)
    queue.add(old)
    queue.add(new)
    assert queue.put(1, _episode(1))
    waiting = asyncio.ensure_future(queue.take(1))
    await asyncio.sleep(0.01)
    assert not waiting.done(), "the newer group must not overtake the oldest"
    assert queue.put(0, _episode(0))
    assert await asyncio.wait_for(waiting, 10) == [old]
    assert await queue.take(1) == [new]
