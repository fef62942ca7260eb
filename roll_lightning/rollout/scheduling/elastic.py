"""`repartition`: the rollout state W ranks saved, dealt out to W' ranks for an elastic resume.

What it keeps (docs/reliability.md, "Resume on another number of ranks"): a group any old rank settled is never
played again; every group an old rank started but did not settle, and every index below the old ranks' highest
started one that none of them reached, is played by exactly one new rank, before anything fresh; fresh groups go
on from the highest started index + 1, rank r' taking every W'-th. Seeds follow from global indices, so the
stream of boards is the one a run on any number of ranks walks through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_lightning.rollout.scheduling.ledger import GroupSequence


@dataclass(frozen=True)
class ElasticResume:
    """What an elastic resume moved: to report in one line."""

    saved_ranks: int
    ranks: int
    replayed: int  # groups started and not settled, played again
    skipped_over: int  # indices no old rank reached below the highest started one, played now
    frontier: dict[str, int]  # per env tag: the first fresh index

    def describe(self) -> str:
        again = self.replayed + self.skipped_over
        return (
            f"saved on {self.saved_ranks} rank{'s' * (self.saved_ranks != 1)}, here on {self.ranks} "
            f"({again} started or skipped group{'s' * (again != 1)} dealt out to play first)"
        )


def repartition(states: list[dict[str, Any]], ranks: int) -> tuple[list[dict[str, Any]], ElasticResume]:
    """Per-rank ledger states (`GroupLedger.state_dict`) of ``len(states)`` ranks as ``ranks`` ranks' states."""
    saved = len(states)
    seeds = {state.get("seed") for state in states}
    if len(seeds) != 1:
        raise ValueError(f"the checkpoint's ranks disagree on the run's seed: {sorted(map(str, seeds))}")
    if any("lanes" not in state for state in states):
        raise ValueError(f"the checkpoint's rollout state is from an older version: resume it on {saved} ranks")
    tags: list[dict[str, dict[str, Any]]] = [state["lanes"] for state in states]
    if any(sorted(t) != sorted(tags[0]) for t in tags):
        raise ValueError(f"the checkpoint's ranks played different envs: {[sorted(t) for t in tags]}")
    out: list[dict[str, Any]] = [
        {"lanes": {}, "batches": max(s["batches"] for s in states), "seed": states[0]["seed"], "world_size": ranks}
        for _ in range(ranks)
    ]
    replayed = skipped = 0
    frontier: dict[str, int] = {}
    for tag in tags[0]:
        old = [_sequence(t[tag], rank, saved) for rank, t in enumerate(tags)]
        top = max((seq.index(seq.next_local - 1) for seq in old if seq.next_local), default=-1)
        base = max([top + 1, *(seq.base for seq in old)])
        unsettled = sorted(i for seq in old for i in seq.unsettled())
        unreached = sorted(i for seq in old for i in _unreached(seq, below=base))
        replayed, skipped = replayed + len(unsettled), skipped + len(unreached)
        handed = sorted(unsettled + unreached)
        frontier[tag] = base
        for rank in range(ranks):
            seq = GroupSequence(stride=ranks, offset=rank, base=base)
            seq.adopted = set(handed[rank::ranks])
            out[rank]["lanes"][tag] = seq.state_dict()
    return out, ElasticResume(saved, ranks, replayed, skipped, frontier)


def _sequence(state: dict[str, Any], rank: int, ranks: int) -> GroupSequence:
    seq = GroupSequence(stride=ranks, offset=rank)
    seq.load_state_dict(state)
    return seq


def _unreached(seq: GroupSequence, below: int) -> list[int]:
    """The indices of ``seq``'s own progression below ``below`` that it never started."""
    out, local = [], seq.next_local
    while seq.index(local) < below:
        out.append(seq.index(local))
        local += 1
    return out
