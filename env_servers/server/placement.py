"""`BatchPlacement`: where a batch's env calls run, chosen from a running average of per-item cost.

``inline`` (on the event loop: for microsecond steps the thread hop costs more, FrozenLake 99 -> 66 us of
server CPU a step), ``pool`` (one pool job for the batch) or ``spread`` (items over many pool threads: 64
concurrent 20 ms steps took 1.3 s as one job, 53 ms spread). An unknown cost never runs inline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Where = Literal["inline", "pool", "spread"]

INLINE_BUDGET_S = 0.005
"""Batches expected under this run inline: a 64-item FrozenLake batch fits on a loaded box (2 ms did not)."""
SPREAD_ITEM_S = 0.001
"""Items slower than this on average are spread."""
NEWEST_WEIGHT = 0.2


@dataclass
class BatchPlacement:
    inline_budget_s: float = INLINE_BUDGET_S
    spread_item_s: float = SPREAD_ITEM_S
    item_seconds: dict[str, float] = field(default_factory=lambda: {"reset": math.inf, "step": math.inf})

    def choose(self, sizes: Mapping[str, int], *, waits_on_io: bool, draining: bool) -> Where:
        """Where a batch of ``sizes`` (kind -> items) runs; a draining server keeps its loop free."""
        if waits_on_io:
            return "spread"
        expected = sum(self.item_seconds[kind] * max(1, n) for kind, n in sizes.items())
        if expected < self.inline_budget_s and not draining:
            return "inline"
        slowest = max(self.item_seconds[kind] for kind in sizes)
        if math.isinf(slowest) or slowest < self.spread_item_s or sum(sizes.values()) < 2:
            return "pool"
        return "spread"

    def record(self, kind: str, per_item_s: float) -> None:
        """Fold one batch's per-item cost into the kind's average."""
        average = self.item_seconds[kind]
        self.item_seconds[kind] = (
            per_item_s if math.isinf(average) else ((1 - NEWEST_WEIGHT) * average + NEWEST_WEIGHT * per_item_s)
        )
