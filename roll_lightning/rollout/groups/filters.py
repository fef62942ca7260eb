"""Dynamic sampling: group filters keep updates from being spent on flat groups (advantage 0). Ties break by group
index, not arrival order, so a resumed run chooses the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import pstdev
from typing import ClassVar, Literal

from roll_lightning.rollout.errors import RolloutConfigError
from roll_lightning.rollout.groups.queue import Group
from roll_lightning.settings import check, choice


def scores(group: Group) -> list[float]:
    return [episode.score for episode in group.episodes]


def spread(group: Group) -> float:
    values = scores(group)
    return max(values) - min(values) if values else 0.0


class GroupFilter:
    """Keeps every group (``kind: none``); the base of the others."""

    name: ClassVar[str] = "none"

    def __init__(self, tolerance: float = 1e-6) -> None:
        self.tolerance = tolerance

    @classmethod
    def from_settings(cls, settings: GroupFilterConfig) -> GroupFilter:
        """The filter built from ``data.rollout.group_filter``, taking the keys it uses."""
        return cls(settings.tolerance)

    def to_play(self, needed: int) -> int:
        """Groups to collect before choosing."""
        return needed

    def max_extra(self, needed: int) -> int:
        """Replacement groups a batch may play beyond ``to_play``."""
        return 0

    def accepts(self, group: Group) -> bool:
        return True

    def choose(self, kept: Sequence[Group], rejected: Sequence[Group], needed: int) -> tuple[list[Group], list[Group]]:
        """The batch's ``needed`` groups, and the rest (filtered)."""
        ranked = list(kept) + sorted(rejected, key=lambda g: (-spread(g), g.index))  # least flat rejected first
        return ranked[:needed], ranked[needed:]

    def flat(self, group: Group) -> bool:
        return spread(group) <= self.tolerance


class ZeroVarianceFilter(GroupFilter):
    """Drops flat groups and plays replacements (``kind: zero_variance``, DAPO's dynamic sampling)."""

    name: ClassVar[str] = "zero_variance"

    def __init__(self, tolerance: float, max_extra_groups: int | None) -> None:
        super().__init__(tolerance)
        self.max_extra_groups = max_extra_groups

    @classmethod
    def from_settings(cls, settings: GroupFilterConfig) -> GroupFilter:
        return cls(settings.tolerance, settings.max_extra_groups)

    def max_extra(self, needed: int) -> int:
        return needed if self.max_extra_groups is None else self.max_extra_groups

    def accepts(self, group: Group) -> bool:
        return not self.flat(group)


class TopPVarianceFilter(GroupFilter):
    """Over-samples and keeps the groups of largest score spread (``kind: top_p_variance``, ROLL's)."""

    name: ClassVar[str] = "top_p_variance"

    def __init__(self, keep_fraction: float, tolerance: float) -> None:
        super().__init__(tolerance)
        self.keep_fraction = keep_fraction

    @classmethod
    def from_settings(cls, settings: GroupFilterConfig) -> GroupFilter:
        return cls(settings.keep_fraction, settings.tolerance)

    def to_play(self, needed: int) -> int:
        return math.ceil(needed / self.keep_fraction - 1e-9)

    def choose(self, kept: Sequence[Group], rejected: Sequence[Group], needed: int) -> tuple[list[Group], list[Group]]:
        ranked = sorted([*kept, *rejected], key=lambda g: (-pstdev(scores(g)), g.index))
        return ranked[:needed], ranked[needed:]


GROUP_FILTERS: dict[str, type[GroupFilter]] = {f.name: f for f in (GroupFilter, ZeroVarianceFilter, TopPVarianceFilter)}
FilterKind = Literal[tuple(GROUP_FILTERS)]  # type: ignore[valid-type]  # the registry's names


@dataclass(frozen=True)
class GroupFilterConfig:
    """Which groups a batch keeps (``data.rollout.group_filter``).

    Args:
        kind: ``none``, ``zero_variance`` (drop flat groups and refill) or ``top_p_variance`` (over-sample, keep
            the largest score spread).
        tolerance: the largest score spread (max - min) that counts as flat.
        keep_fraction: ``top_p_variance``: the share of played groups kept (not the sampling top_p).
        max_extra_groups: ``zero_variance``: replacement groups per batch, at most (None: one batch's worth).
    """

    kind: FilterKind = "none"
    tolerance: float = 1e-6
    keep_fraction: float = 0.5
    max_extra_groups: int | None = None

    def check(self, group_size: int) -> None:
        key = "data.rollout.group_filter"
        rules = {
            "kind": choice(self, "kind"),
            "tolerance": (self.tolerance >= 0, ">= 0"),
            "keep_fraction": (0 < self.keep_fraction <= 1, "in (0, 1]"),
            "max_extra_groups": (self.max_extra_groups is None or self.max_extra_groups >= 0, ">= 0, or null"),
        }
        check(key, self, rules, RolloutConfigError)
        if self.kind != "none" and group_size < 2:
            raise RolloutConfigError(
                f"{key}.kind={self.kind} compares the members of a group, but data.rollout.group_size={group_size}: "
                "a group of one has no spread (use group_size >= 2, or kind: none)"
            )

    def build(self) -> GroupFilter:
        """The filter ``kind`` names (`GROUP_FILTERS`)."""
        return GROUP_FILTERS[self.kind].from_settings(self)


class GroupSelection:
    """The groups collected for one batch."""

    def __init__(self, group_filter: GroupFilter, needed: int) -> None:
        self.filter, self.needed = group_filter, needed
        self.target = group_filter.to_play(needed)
        self.max_extra = group_filter.max_extra(needed)
        self.kept: list[Group] = []
        self.rejected: list[Group] = []

    def offer(self, group: Group) -> None:
        (self.kept if self.filter.accepts(group) else self.rejected).append(group)

    @property
    def missing(self) -> int:
        """Groups still to collect (0 once ``target`` passed or the budget is spent)."""
        budget_left = self.target + self.max_extra - len(self.kept) - len(self.rejected)
        return max(0, min(self.target - len(self.kept), budget_left))

    def choose(self) -> tuple[list[Group], list[Group]]:
        """``(batch groups, filtered groups)``."""
        return self.filter.choose(self.kept, self.rejected, self.needed)

    def result(self) -> tuple[list[Group], list[Group], dict[str, float]]:
        """``(batch groups, filtered groups, metrics)``."""
        chosen, filtered = self.choose()
        return chosen, filtered, filter_metrics(self.filter, chosen, filtered, self.needed)


def filter_metrics(
    group_filter: GroupFilter, chosen: Sequence[Group], filtered: Sequence[Group], needed: int
) -> dict[str, float]:
    """``rollout/`` metrics of one batch's selection."""
    collected = [*chosen, *filtered]

    def flat_share(groups: Sequence[Group]) -> float:
        return sum(group_filter.flat(g) for g in groups) / len(groups) if groups else 0.0

    metrics = {"rollout/flat_group_share": flat_share(chosen)}
    if type(group_filter) is not GroupFilter:  # without a filter: 0, 0 and the same share
        metrics["rollout/groups_filtered"] = float(len(filtered))
        metrics["rollout/extra_groups"] = float(len(collected) - needed)
        metrics["rollout/flat_group_share_before_filter"] = flat_share(collected)
    return metrics
