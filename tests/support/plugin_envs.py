"""Envs that exist to misbehave, for fault tests. Registered on import (`serve --import support.plugin_envs`).

- ``crashy``: a step whose action contains "crash" raises inside the env (the item must fail INTERNAL).
- ``slow``: each step sleeps ``delay_s`` seconds and counts how often it really ran (for deadline/replay tests);
  with ``mark_dir`` each step leaves a file there as it starts (a test can tell a rollout is in flight).
- ``dice``: declares ``deterministic: false`` and ignores its seed (as OpenEnv's chess does).
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from env_servers import EnvSpec, register

_GAUGE_LOCK = threading.Lock()


@dataclass(frozen=True)
class CounterConfig:
    max_steps: int = 5
    delay_s: float = 0.0
    mark_dir: str = ""


class _CounterEnv:
    """Observation = the step count; episodes last ``max_steps`` steps."""

    env_id = "counter"
    executed_steps = 0  # class-wide: counts real env.step executions in this process
    in_step = 0  # steps running right now, in any session (all counter envs)
    max_in_step = 0

    def __init__(self, config: CounterConfig) -> None:
        self.config = config
        self.t = 0
        self.seed = 0

    @classmethod
    def describe(cls, config: CounterConfig) -> EnvSpec:
        return EnvSpec(
            env_id=cls.env_id,
            version="1",
            instruction="count",
            action_format="any text",
            example_action="go",
            max_steps=config.max_steps,
            reward_min=0.0,
            reward_max=1.0,
        )

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        self.t, self.seed = 0, seed
        return f"seed={seed} t=0", {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        with _GAUGE_LOCK:
            _CounterEnv.in_step += 1
            _CounterEnv.max_in_step = max(_CounterEnv.max_in_step, _CounterEnv.in_step)
        try:
            if self.config.mark_dir:
                Path(self.config.mark_dir).mkdir(parents=True, exist_ok=True)
                Path(self.config.mark_dir, f"{os.getpid()}-{id(self)}-{time.monotonic_ns()}").touch()
            if self.config.delay_s:
                time.sleep(self.config.delay_s)
        finally:
            with _GAUGE_LOCK:
                _CounterEnv.in_step -= 1
        type(self).executed_steps += 1
        self.t += 1
        return f"seed={self.seed} t={self.t}", 1.0, False, self.t >= self.config.max_steps, {"metrics": {"t": self.t}}


@register("crashy", CounterConfig)
class CrashyEnv(_CounterEnv):
    env_id = "crashy"
    forkable = True  # so that a server the suite starts passes the fork rules too

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if "crash" in action:
            raise RuntimeError("boom: the env itself failed")
        return super().step(action)


@register("slow", CounterConfig)
class SlowEnv(_CounterEnv):
    env_id = "slow"


@register("waiting", CounterConfig)
class WaitingEnv(_CounterEnv):
    """Stands for an env whose calls wait on I/O (a remote server): the runtime spreads its batches."""

    env_id = "waiting"
    waits_on_io = True


LOADING = threading.Event()  # `slowload` envs cannot be built until this is set


@register("slowload", CounterConfig)
class SlowLoadEnv(_CounterEnv):
    """Stands for an env with a long load (a dataset, an index): building it waits for `LOADING`."""

    env_id = "slowload"

    def __init__(self, config: CounterConfig) -> None:
        if not LOADING.wait(timeout=30):
            raise TimeoutError("slowload was never released")
        super().__init__(config)


@register("dice", CounterConfig)
class DiceEnv(_CounterEnv):
    """Each observation is a fresh roll that no seed fixes, and the spec says so (``deterministic: false``)."""

    env_id = "dice"

    @classmethod
    def describe(cls, config: CounterConfig) -> EnvSpec:
        return dataclasses.replace(super().describe(config), deterministic=False)

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed, options)
        return f"rolled {random.SystemRandom().random()}", {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        _, reward, done, truncated, info = super().step(action)
        return f"rolled {random.SystemRandom().random()}", reward, done, truncated, info
