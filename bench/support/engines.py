"""`SimulatedEngine` whose replies take a time drawn per reply: uneven replies for the scheduling benchmarks."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from roll_lightning.rollout.engines import SimulatedEngine


class DrawnLatencyEngine(SimulatedEngine):
    """`SimulatedEngine` whose every reply takes ``draw(rng)`` seconds, ``rng`` a `random.Random` of its own seeded
    with ``seed`` (the reply texts keep the base class's draws).

    `SimulatedEngine.generate` reads ``latency_s`` once per reply, so here it is a property that draws; its setter
    ignores the fixed latency the base constructor sets."""

    def __init__(
        self, tokenizer: Any, replies: Sequence[str], draw: Callable[[random.Random], float], seed: int = 0
    ) -> None:
        self._draw = draw
        self._latency_rng = random.Random(seed)
        super().__init__(tokenizer, replies, latency_s=0.0, seed=seed)

    @property
    def latency_s(self) -> float:
        return self._draw(self._latency_rng)

    @latency_s.setter
    def latency_s(self, value: float) -> None:
        pass
