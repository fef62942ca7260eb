"""`GroupLedger`: which groups a rank plays (r, r+W, ...), with which seeds, and what a resume plays again
(`elastic.py`: on another number of ranks)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from roll_lightning.rollout.groups.queue import Group

if TYPE_CHECKING:
    from roll_lightning.rollout.scheduling.lanes import LaneState

Split = Literal["train", "eval"]


def group_seed(run_seed: int, group_index: int, split: Split = "train", salt: int | None = None) -> int:
    """Group ``group_index``'s env seed: even for training, odd for evaluation; ``salt`` separates a run's envs."""
    entropy = [run_seed, group_index] if salt is None else [run_seed, salt, group_index]
    value = int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFF_FFFF)
    return value | 1 if split == "eval" else value & ~1


class GroupSequence:
    """A rank's groups of one env, as global indices: first those a resume hands it (``restart``), then its own
    progression ``base + k * stride + offset`` for k = 0, 1, ...; it knows which are started and which settled
    (consumed, filtered or dropped), so a resume replays exactly the started, unsettled ones."""

    def __init__(self, stride: int = 1, offset: int = 0, base: int = 0) -> None:
        self.stride, self.offset, self.base = stride, offset, base
        self.next_local = 0  # k of the next fresh group
        self.watermark = 0  # every k below it is settled
        self.settled_above: set[int] = set()
        self.adopted: set[int] = set()  # global indices handed over by an elastic resume, not settled yet
        self.restart: deque[int] = deque()  # global indices to play before fresh ones

    def index(self, local: int) -> int:
        return self.base + local * self.stride + self.offset

    def take(self) -> int:
        """The next global group index to play (replays first)."""
        if self.restart:
            return self.restart.popleft()
        self.next_local += 1
        return self.index(self.next_local - 1)

    def settle(self, index: int) -> None:
        if index in self.adopted:
            self.adopted.remove(index)
            return
        local, off = divmod(index - self.base - self.offset, self.stride)
        if off or local < self.watermark or local in self.settled_above:
            return
        self.settled_above.add(local)
        while self.watermark in self.settled_above:
            self.settled_above.remove(self.watermark)
            self.watermark += 1

    def unsettled(self) -> list[int]:
        """Started (or handed over) and not settled: what a resume plays again."""
        own = (self.index(k) for k in range(self.watermark, self.next_local) if k not in self.settled_above)
        return sorted(self.adopted) + list(own)

    def state_dict(self) -> dict[str, Any]:
        return {
            "next_local": self.next_local,
            "watermark": self.watermark,
            "settled_above": sorted(self.settled_above),
            "base": self.base,
            "stride": self.stride,
            "offset": self.offset,
            "adopted": sorted(self.adopted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_local, self.watermark = state["next_local"], state["watermark"]
        self.settled_above = set(state["settled_above"])
        # checkpoints from before elastic resume hold only the first three: the ledger's own placement stands
        self.base = state.get("base", 0)
        self.stride, self.offset = state.get("stride", self.stride), state.get("offset", self.offset)
        self.adopted = set(state.get("adopted", ()))
        self.restart = deque(self.unsettled())


class GroupLedger:
    def __init__(self, lanes: list[LaneState], *, seed: int, rank: int, world_size: int, split: Split) -> None:
        self.lanes, self.seed, self.rank, self.world_size, self.split = lanes, seed, rank, world_size, split
        self.batches = 0  # batches handed out (kept in the checkpoint)
        for lane in lanes:
            lane.sequence.stride, lane.sequence.offset = world_size, rank

    def new_group(self, lane: LaneState, size: int, version: int) -> Group:
        """The lane's next group, started at policy ``version``."""
        index = lane.sequence.take()
        seed = group_seed(self.seed, index, self.split, lane.spec.seed_salt)
        return Group(index, seed, size, version, lane=lane.position)

    def settle(self, group: Group) -> None:
        """``group`` is consumed or dropped: never played again."""
        self.lanes[group.lane].sequence.settle(group.index)

    def state_dict(self) -> dict[str, Any]:
        return {
            "lanes": {lane.tag: lane.sequence.state_dict() for lane in self.lanes},
            "batches": self.batches,
            "seed": self.seed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.seed or state.get("world_size") != self.world_size:
            raise ValueError(
                f"rollout state was saved with seed={state.get('seed')}, world_size={state.get('world_size')}; "
                f"this run has seed={self.seed}, world_size={self.world_size}"
            )
        saved = state["lanes"] if "lanes" in state else {self.lanes[0].tag: state}  # an older, untagged checkpoint
        tags = [lane.tag for lane in self.lanes]
        if sorted(saved) != sorted(tags):
            raise ValueError(
                f"rollout state was saved for the envs {sorted(saved)}; this run plays {sorted(tags)} "
                "(data.rollout.envs tags must match to resume)"
            )
        for lane in self.lanes:
            lane.sequence.load_state_dict(saved[lane.tag])
        self.batches = state["batches"]
