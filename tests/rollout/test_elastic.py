"""`repartition`: a ledger saved by W ranks resumed on W' ranks (docs/reliability.md, "Resume on another number of
ranks"), checked against the rule on random histories of starts and settles."""

from __future__ import annotations

import random

import pytest

from roll_lightning.rollout import RolloutConfig
from roll_lightning.rollout.scheduling.elastic import repartition
from roll_lightning.rollout.scheduling.ledger import GroupLedger, GroupSequence, group_seed


class _Lane:
    """The two fields of `LaneState` the ledger reads, around a real `GroupSequence`."""

    def __init__(self, env_id: str = "sokoban", tag: str | None = None) -> None:
        config = (
            RolloutConfig(env_id=env_id)
            if tag is None
            else RolloutConfig(envs=[{"tag": tag, "env_id": env_id, "groups": 1}])
        )
        (self.spec,) = config.lanes
        self.position = 0
        self.sequence = GroupSequence()

    @property
    def tag(self) -> str:
        return self.spec.tag


def _ledgers(world: int, seed: int = 3) -> list[tuple[GroupLedger, _Lane]]:
    out = []
    for rank in range(world):
        lane = _Lane()
        out.append((GroupLedger([lane], seed=seed, rank=rank, world_size=world, split="train"), lane))  # type: ignore[list-item]
    return out


def _play(ledgers: list[tuple[GroupLedger, _Lane]], rng: random.Random, steps: int) -> tuple[set[int], list[int]]:
    """Each rank starts some groups and settles a random part of what it holds; returns (settled, started)."""
    settled: set[int] = set()
    started: list[int] = []
    held: list[list] = [[] for _ in ledgers]
    for _ in range(steps):
        for (ledger, lane), mine in zip(ledgers, held, strict=True):
            for _ in range(rng.randint(0, 3)):
                group = ledger.new_group(lane, size=2, version=0)  # type: ignore[arg-type]
                started.append(group.index)
                mine.append(group)
            rng.shuffle(mine)
            for group in mine[: rng.randint(0, len(mine))]:
                ledger.settle(group)
                settled.add(group.index)
                mine.remove(group)
    return settled, started


@pytest.mark.parametrize(("old", "new"), [(2, 1), (1, 2), (2, 3), (3, 2), (4, 4), (1, 1)])
@pytest.mark.parametrize("history", range(12))
def test_settled_groups_stay_settled_and_the_rest_is_played_once_by_one_rank(old: int, new: int, history: int) -> None:
    rng = random.Random(history * 100 + old * 10 + new)
    before = _ledgers(old)
    settled, started = _play(before, rng, steps=rng.randint(0, 6))
    states, moved = repartition([ledger.state_dict() for ledger, _ in before], new)
    after = _ledgers(new)
    for (ledger, _), state in zip(after, states, strict=True):
        ledger.load_state_dict(state)
    top = max(started, default=-1)
    owed = set(range(top + 1)) - settled  # started and unsettled, or never reached below the highest started
    assert moved.replayed + moved.skipped_over == len(owed)
    # each new rank plays its share of what is owed before anything fresh, and then fresh indices above `top`
    played: list[int] = []
    for ledger, lane in after:
        mine: list[int] = []
        while len([i for i in mine if i > top]) < 3:  # its share of what is owed, then three fresh groups
            mine.append(ledger.new_group(lane, size=2, version=0).index)  # type: ignore[arg-type]
        share = [i for i in mine if i <= top]
        assert mine[: len(share)] == share, "what is owed comes first"
        played += mine
    assert len(played) == len(set(played)), "no group twice"
    assert owed <= set(played) and not set(played) & settled
    # fresh indices go on densely: together the ranks' next three groups each are top+1, top+2, ... with no gap
    fresh = sorted(i for i in played if i > top)
    assert fresh == list(range(top + 1, top + 1 + len(fresh)))


def test_a_resumed_rank_settles_handed_over_groups_and_saves_them_again() -> None:
    """A handed-over group settled on the new rank is gone from its state; one still open is saved and replayed
    by a further resume, even on yet another number of ranks."""
    before = _ledgers(2)
    for ledger, lane in before:
        for _ in range(3):
            ledger.new_group(lane, size=2, version=0)  # type: ignore[arg-type]  # 0..5 started, none settled
    states, _ = repartition([ledger.state_dict() for ledger, _ in before], 1)
    ((ledger, lane),) = _ledgers(1)
    ledger.load_state_dict(states[0])
    first = [ledger.new_group(lane, size=2, version=0) for _ in range(4)]  # type: ignore[arg-type]
    assert [g.index for g in first] == [0, 1, 2, 3]
    ledger.settle(first[1])
    states, moved = repartition([ledger.state_dict()], 3)
    assert moved.replayed == 5 and moved.frontier == {"sokoban": 6}  # 0, 2, 3 taken + 4, 5 still handed over
    owed = []
    for rank, (ledger3, lane3) in enumerate(_ledgers(3)):
        ledger3.load_state_dict(states[rank])
        owed += [ledger3.new_group(lane3, size=2, version=0).index for _ in range(2)]  # type: ignore[arg-type]
    assert sorted(owed) == [0, 2, 3, 4, 5, 8]  # ranks 0, 1 hold two owed each; rank 2 one, then its first fresh: 6+2


def test_seeds_follow_the_global_index_whatever_the_number_of_ranks() -> None:
    before = _ledgers(2, seed=11)
    for ledger, lane in before:
        ledger.new_group(lane, size=2, version=0)  # type: ignore[arg-type]
    states, _ = repartition([ledger.state_dict() for ledger, _ in before], 3)
    for rank, (ledger, lane) in enumerate(_ledgers(3, seed=11)):
        ledger.load_state_dict(states[rank])
        group = ledger.new_group(lane, size=2, version=0)  # type: ignore[arg-type]
        assert group.seed == group_seed(11, group.index, "train", lane.spec.seed_salt)


def test_a_checkpoint_whose_ranks_disagree_is_refused_by_name() -> None:
    a, b = (ledger.state_dict() for ledger, _ in _ledgers(2))
    b["seed"] = 4
    with pytest.raises(ValueError, match="disagree on the run's seed"):
        repartition([a, b], 3)
