"""`BatchPlacement`: where a batch's env calls run, chosen per batch from what its items have cost so far.

- ``inline``: on the server's event loop. For envs whose steps take microseconds (FrozenLake, Sokoban) the hop
  to a pool thread and the GIL hand-offs cost more than the steps: inline batches took FrozenLake from 99 to
  66 us of server CPU per step (docs/benchmarks.md, "Env servers").
- ``pool``: the whole batch as one job on the thread pool (one thread hop per batch, not per item), so a slow
  env cannot stall health checks or other sessions.
- ``spread``: the items over many pool threads at once, for items slow enough that one job would add their
  latencies up (64 concurrent 20 ms steps: 1.3 s one after another, 53 ms spread), and always for envs that
  declare ``waits_on_io`` (a remote env, a tool server).

The cost of an item is a running average per kind (reset, step), unknown until measured: an unknown cost never
runs inline, and an env that turns slow is moved off the loop by the same average.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Where = Literal["inline", "pool", "spread"]

INLINE_BUDGET_S = 0.005
"""A batch whose expected cost is under this runs inline: a whole 64-item FrozenLake batch fits even on a loaded
box (at 2 ms it went to the pool and cost ~10 us more server CPU a step)."""
SPREAD_ITEM_S = 0.001
"""Items slower than this (on average) are spread over the pool's threads."""
NEWEST_WEIGHT = 0.2  # the running average's weight on the newest batch


@dataclass
class BatchPlacement:
    inline_budget_s: float = INLINE_BUDGET_S
    spread_item_s: float = SPREAD_ITEM_S
    item_seconds: dict[str, float] = field(default_factory=lambda: {"reset": math.inf, "step": math.inf})

    def choose(self, sizes: Mapping[str, int], *, waits_on_io: bool, draining: bool) -> Where:
        """Where a batch of ``sizes`` (kind -> items) runs. A draining server keeps its loop for the drain."""
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
        """Fold one batch's cost per item into the kind's average (the first measurement replaces 'unknown')."""
        average = self.item_seconds[kind]
        self.item_seconds[kind] = (
            per_item_s if math.isinf(average) else ((1 - NEWEST_WEIGHT) * average + NEWEST_WEIGHT * per_item_s)
        )
