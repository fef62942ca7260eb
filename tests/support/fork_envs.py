"""Envs for the fork rules (registered on import): ``trail`` forks right; the others fork wrong, as an env author
might, and each must fail the conformance rule named beside it.

``trail``: each step appends the reply's first letter and a digit drawn from the env's own RNG (seeded at reset),
so a copy answers as the original only when both its list and its RNG were copied.
- ``trail-shared-rng``: its fork shares the RNG with the original (fork-exact, fork-independent);
- ``trail-shallow``: its fork shares the list (fork-exact, fork-independent);
- ``trail-fixed``: no fork at all (every fork rule skips; fork-refused checks the refusal).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from env_servers import EnvSpec, register


@dataclass(frozen=True)
class TrailConfig:
    max_steps: int = 6


class _Trail:
    env_id = "trail"

    def __init__(self, config: TrailConfig) -> None:
        self.config = config
        self.trail: list[str] = []
        self.rng = np.random.default_rng(0)

    @classmethod
    def describe(cls, config: TrailConfig) -> EnvSpec:
        return EnvSpec(
            env_id=cls.env_id,
            version="1",
            instruction="leave a trail",
            action_format="a word",
            example_action="north",
            max_steps=config.max_steps,
            reward_min=0.0,
            reward_max=1.0,
        )

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        self.trail, self.rng = [], np.random.default_rng(seed)
        return "trail:", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.trail.append(f"{(action or '?')[0]}{int(self.rng.integers(10))}")
        done = len(self.trail) >= self.config.max_steps
        return "trail: " + " ".join(self.trail), float(self.trail[-1][-1] == "7"), False, done, {}


@register("trail", TrailConfig)
class TrailEnv(_Trail):
    forkable = True  # a deep copy: the list and the RNG


@register("trail-shared-rng", TrailConfig)
class SharedRngTrail(_Trail):
    env_id = "trail-shared-rng"

    def fork(self) -> SharedRngTrail:
        return copy.deepcopy(self, {id(self.rng): self.rng})  # wrong: both draw from one stream


@register("trail-shallow", TrailConfig)
class ShallowTrail(_Trail):
    env_id = "trail-shallow"

    def fork(self) -> ShallowTrail:
        twin = copy.copy(self)  # wrong: one list for both
        twin.rng = copy.deepcopy(self.rng)
        return twin


@register("trail-fixed", TrailConfig)
class FixedTrail(_Trail):
    env_id = "trail-fixed"
