"""`GroupQueue`: collects episodes into groups and releases only complete, fresh ones; groups are dropped only
here (`drop`, `expire`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from roll_lightning.rollout.episodes.episode import Episode


def is_stale(version: int, group_version: int, max_staleness: int) -> bool:
    """Whether a group whose oldest reply came from ``group_version`` is more than ``max_staleness`` versions
    behind ``version`` (0: strictly on-policy)."""
    return version - group_version > max_staleness


@dataclass
class Group:
    index: int  # global: fixes the seed and the resume position
    seed: int
    size: int  # members needed (more may run: group_redundancy)
    started_version: int
    lane: int = 0  # position in rollout.envs
    episodes: list[Episode] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    finished: bool = False  # released or dropped
    branches: Any = None  # its `scheduling.branches.BranchPlan` (data.rollout.branch), else None

    @property
    def complete(self) -> bool:
        return len(self.episodes) >= self.size

    @property
    def policy_version(self) -> int:
        versions = [ep.policy_version for ep in self.episodes if ep.turns]
        return min(versions, default=self.started_version)


class GroupQueue:
    """Groups of one lane; ``in_start_order`` (``staleness: admit``): release the oldest started first, so none
    goes stale."""

    def __init__(self, max_staleness: int, in_start_order: bool = False) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.in_start_order = in_start_order
        self.live: dict[int, Group] = {}
        self._ready: deque[Group] = deque()
        self._changed = asyncio.Event()
        self.counters = {"released": 0, "dropped_failed": 0, "dropped_stale": 0}
        self.error: BaseException | None = None

    def add(self, group: Group) -> None:
        self.live[group.index] = group

    def put(self, index: int, episode: Episode) -> bool:
        """Add a finished episode; True when it completed its group."""
        group = self.live.get(index)
        if group is None or group.finished or group.complete:
            return False
        group.episodes.append(episode)
        if group.complete:
            self._ready.append(group)
            self._changed.set()
            return True
        return False

    def drop(self, index: int, reason: str) -> Group | None:
        group = self.live.pop(index, None)
        if group is None or group.finished:
            return None
        group.finished = True
        if group in self._ready:
            self._ready.remove(group)
        self.counters[f"dropped_{reason}"] += 1
        self._changed.set()
        return group

    def expire(self, version: int) -> list[Group]:
        """Drop every group already too stale for ``version``."""
        stale = [g for g in self.live.values() if is_stale(version, g.policy_version, self.max_staleness)]
        return [g for g in (self.drop(g.index, "stale") for g in stale) if g is not None]

    def fail(self, error: BaseException) -> None:
        """Make every waiting and later `take` raise ``error``."""
        if self.error is None:
            self.error = error
        self._changed.set()

    async def take(self, n_groups: int) -> list[Group]:
        """Wait for ``n_groups`` complete groups and release them; raises what `fail` recorded."""
        while not self._releasable(n_groups):
            if self.error is not None:
                raise self.error
            self._changed.clear()
            await self._changed.wait()
        if self.in_start_order:
            out = [self.live[index] for index in sorted(self.live)[:n_groups]]
            for group in out:
                self._ready.remove(group)
        else:
            out = [self._ready.popleft() for _ in range(n_groups)]
        for group in out:
            group.finished = True
            self.live.pop(group.index, None)
        self.counters["released"] += n_groups
        return out

    def _releasable(self, n_groups: int) -> bool:
        if not self.in_start_order:
            return len(self._ready) >= n_groups
        oldest = sorted(self.live)[:n_groups]
        return len(oldest) == n_groups and all(self.live[index].complete for index in oldest)

    @property
    def ready(self) -> int:
        return len(self._ready)
