"""Serve GEM environments (the optional `gem-llm` distribution) over our protocol: ids ``gem:<GEM id>``.

    python -m env_servers serve gem:game:GuessTheNumber-v0-easy gem:game:Minesweeper-v0-easy

Offline, the `game:*` ids work except Wordle, Hangman and WordSearch (NLTK data); dataset ids need the HF Hub.
Each session runs GEM under its own `GlobalRng`; ``info["suffix"]`` (the board or prompt) is appended to the
observation, as ROLL's GEM template does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env_servers.api import EnvSpec, json_object, package_version
from env_servers.envs.global_rng import GlobalRng
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "gem:"


@dataclass(frozen=True)
class GemConfig:
    max_steps: int = field(default=50, metadata={"doc": "turns before we truncate (GEM games also have their own)"})
    make_kwargs: str = field(default="{}", metadata={"doc": "JSON object of keyword arguments for gem.make"})

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        json_object(self.make_kwargs, "make_kwargs")


def _import_gem() -> Any:
    try:
        import gem
    except ImportError as exc:
        raise RuntimeError(
            "GEM envs need the optional gem-llm package: pip install 'roll_lightning[gem]' (Python <= 3.12.0)"
        ) from exc
    return gem


class GemEnv:
    """One GEM env instance with its own copy of the global RNG states."""

    forkable = True  # a deep copy of the game and of those RNG states (tests show it exact)

    gem_id = ""

    def __init__(self, config: GemConfig) -> None:
        gem = _import_gem()
        self.config = config
        self.rng = GlobalRng()
        self.env = self.rng.run(gem.make, self.gem_id, **json_object(config.make_kwargs, "make_kwargs"))
        self._steps = 0

    @staticmethod
    def _observation(obs: Any, info: Mapping[str, Any]) -> str:
        suffix = info.get("suffix")
        return f"{obs}\n{suffix}" if suffix else str(obs)

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._steps = 0
        obs, info = self.rng.run(self.env.reset, seed=seed % 2**32)  # numpy seeds are 32-bit
        return self._observation(obs, info), {"seed": seed, **_plain(info, skip="suffix")}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.rng.run(self.env.step, action)
        self._steps += 1
        truncated = bool(truncated) or (not terminated and self._steps >= self.config.max_steps)
        # GEM marks a malformed reply only by its format-error reward.
        invalid = bool(terminated) and float(reward) == float(getattr(self.env, "format_error_reward", -0.1))
        metrics = {"action_valid": float(not invalid), "success": float(float(reward) >= 1.0 and bool(terminated))}
        extra = {"action_valid": not invalid, "metrics": metrics, **_plain(info, skip="suffix")}
        return self._observation(obs, info), float(reward), bool(terminated), truncated, extra

    @classmethod
    def describe(cls, config: GemConfig) -> EnvSpec:
        probe = cls(config)
        instruction, _ = probe.reset(0)
        example = str(probe.rng.run(probe.env.sample_random_action))
        return EnvSpec(
            env_id=PREFIX + cls.gem_id,
            version=f"gem-llm-{package_version('gem-llm')}",
            instruction=instruction,
            action_format="free text; GEM reads the last \\boxed{...} in the reply",
            example_action=example,
            max_steps=config.max_steps,
            reward_min=-1.0,
            reward_max=1.0,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=("action_valid", "success"),
        )


def _plain(info: Mapping[str, Any], skip: str) -> dict[str, Any]:
    """The JSON-representable scalars of GEM's info."""
    out = {}
    for key, value in info.items():
        value = value.item() if isinstance(value, np.generic) else value  # np.float64(0.5) -> 0.5
        if key != skip and isinstance(value, str | int | float | bool):
            out[str(key)] = value
    return out


def _entry(env_id: str) -> EnvEntry:
    gem_id = env_id[len(PREFIX) :]
    if not gem_id:
        raise KeyError(f"'{env_id}': name a GEM id after 'gem:', e.g. gem:game:GuessTheNumber-v0-easy")
    gem = _import_gem()
    if gem_id not in getattr(gem.envs.registration, "ENV_REGISTRY", {gem_id: None}):
        raise KeyError(f"unknown GEM id '{gem_id}'")
    env_cls = type(f"Gem[{gem_id}]", (GemEnv,), {"gem_id": gem_id})
    return EnvEntry(env_id, env_cls, GemConfig)


register_prefix(PREFIX, _entry)
