"""``latency``: a bench-only env whose episodes vary in length and whose steps take a heterogeneous wall time.

Registered on import (``python -m env_servers serve latency --import bench.support.latency_env``). Any reply is a
valid action; the work is only waiting, so the rollout scheduler is measured, not the env.

- Episode length: drawn from the reset seed, uniform in ``[min_steps, max_steps]``; the episode terminates there
  (reward 1.0 on the last step, 0 before).
- Step latency: ``median_ms * slow_factor * lognormal(0, sigma)`` seconds of `time.sleep`, one draw per step (and
  one for the reset), all from the reset seed, so a seed gives the same lengths and latencies on every run.
  ``slow_factor`` is meant to be set per server by the operator (``--env-config latency='{"slow_factor": 3}'``):
  members of a group share a seed but land on different servers, so a slow server makes a group heterogeneous.

`time.sleep` holds no CPU and releases the GIL: the latency stands for an env that waits on something else (a
sandbox, a tool, a remote service). A server runs the items of one BatchStep one after another on one thread, so
these sleeps add up within a batch; the benchmark uses the unary transport with many server worker threads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env_servers import EnvSpec, register


@dataclass(frozen=True)
class LatencyConfig:
    min_steps: int = field(default=2, metadata={"doc": "shortest episode (steps)"})
    max_steps: int = field(default=10, metadata={"doc": "longest episode (steps)"})
    median_ms: float = field(default=20.0, metadata={"doc": "median step latency before slow_factor"})
    sigma: float = field(default=0.75, metadata={"doc": "log-space spread of the step latency (0 = fixed)"})
    slow_factor: float = field(
        default=1.0, metadata={"doc": "multiplies every latency: set per server with --env-config", "server_only": True}
    )
    reset_latency: bool = field(default=True, metadata={"doc": "reset sleeps one latency draw too"})

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if self.median_ms < 0 or self.sigma < 0 or self.slow_factor <= 0:
            raise ValueError("median_ms and sigma must be >= 0 and slow_factor > 0")


def episode_plan(config: LatencyConfig, seed: int) -> tuple[int, list[float]]:
    """(episode length, latency in seconds of the reset and of each step) for ``seed``."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(config.min_steps, config.max_steps + 1))
    scale = config.median_ms / 1000.0 * config.slow_factor
    draws = rng.lognormal(0.0, config.sigma, size=length + 1) if config.sigma else np.ones(length + 1)
    return length, [float(scale * d) for d in draws]


def expected_step_s(config: LatencyConfig) -> float:
    """Mean latency of one step (lognormal mean)."""
    return config.median_ms / 1000.0 * config.slow_factor * math.exp(config.sigma**2 / 2)


@register("latency", LatencyConfig)
class LatencyEnv:
    def __init__(self, config: LatencyConfig) -> None:
        self.config = config
        self.seed = 0
        self.t = 0
        self.length = 0
        self.latencies: list[float] = []

    @classmethod
    def describe(cls, config: LatencyConfig) -> EnvSpec:
        return EnvSpec(
            env_id="latency",
            version="1",
            instruction="Reply with anything; the episode ends after a number of steps fixed by its seed.",
            action_format="any text",
            example_action="<answer>Left</answer>",
            max_steps=config.max_steps,
            reward_min=0.0,
            reward_max=1.0,
            metrics=("steps",),
        )

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        self.seed, self.t = seed, 0
        self.length, self.latencies = episode_plan(self.config, seed)
        if self.config.reset_latency:
            time.sleep(self.latencies[0])
        return self._observation(), {"length": self.length}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        time.sleep(self.latencies[min(self.t, self.length)])
        done = self.t >= self.length
        return self._observation(), float(done), done, False, {"metrics": {"steps": float(self.t)}}

    def _observation(self) -> str:
        return f"Task {self.seed % 1000}, step {self.t}. The board:\n#####\n#_P_#\n#_O_#\n#####"
