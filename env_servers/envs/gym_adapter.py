"""Serve Gymnasium environments as text envs: ids ``gym:<Gymnasium id>`` (optional `[gym]` extra).

    python -m env_servers serve gym:FrozenLake-v1 gym:Blackjack-v1 gym:Taxi-v3

Observation: the ANSI render if the env has one, else the observation as JSON, then the legal actions. Action:
``<answer>N</answer>`` (a `Discrete` index, or the text for a `Text` space); anything else is an invalid step
(no env step, the format penalty). Gymnasium envs own their RNG, so sessions stay isolated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env_servers.api import EnvSpec, json_object
from env_servers.envs.answer import extract_answer
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "gym:"


@dataclass(frozen=True)
class GymConfig:
    max_steps: int = field(default=100, metadata={"doc": "turns before we truncate (the env's own limit also applies)"})
    format_penalty: float = field(default=-0.1, metadata={"doc": "reward for a reply that names no legal action"})
    make_kwargs: str = field(default="{}", metadata={"doc": "JSON object of keyword arguments for gymnasium.make"})

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        json_object(self.make_kwargs, "make_kwargs")


def _import_gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise RuntimeError("Gymnasium envs need the optional extra: pip install 'roll_lightning[gym]'") from exc
    return gymnasium


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


class GymTextEnv:
    """One Gymnasium env instance behind the text contract."""

    forkable = True  # a deep copy of the Gymnasium env, its np_random included (tests show it exact)

    gym_id = ""

    def __init__(self, config: GymConfig) -> None:
        gymnasium = _import_gymnasium()
        self.config = config
        kwargs = json_object(config.make_kwargs, "make_kwargs")
        self.env = gymnasium.make(self.gym_id, **kwargs)
        self._ansi = "ansi" in self.env.metadata.get("render_modes", ())
        if self._ansi:  # made again to render text; the first one is released
            self.env.close()
            self.env = gymnasium.make(self.gym_id, render_mode="ansi", **kwargs)
        self._space = self.env.action_space
        self._steps = 0

    def _legal(self) -> str:
        space = self._space
        if hasattr(space, "n"):
            start = int(getattr(space, "start", 0))
            return f"Legal actions: <answer>N</answer> with N in {start}..{start + int(space.n) - 1}"
        return "Legal actions: <answer>text</answer>"

    def _text(self, obs: Any) -> str:
        board = _plain_ansi(self.env.render()).strip("\n").rstrip() if self._ansi else json.dumps(_jsonable(obs))
        return f"{board}\n{self._legal()}"

    def close(self) -> None:
        """Release the Gymnasium env (its renderer's window or files); the server calls it when a session ends."""
        self.env.close()

    def _parse(self, reply: str) -> Any:
        answer = extract_answer(reply)
        if answer is None:
            return None
        answer = answer.strip()
        if hasattr(self._space, "n"):
            if not answer.lstrip("-").isdigit():
                return None
            action = int(answer)
            return action if self._space.contains(action) else None
        return answer if self._space.contains(answer) else None

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._steps = 0
        obs, info = self.env.reset(seed=seed % 2**32, options=dict(options) if options else None)
        self._last = obs
        return self._text(obs), {"seed": seed, **_plain(info)}

    def step(self, reply: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._steps += 1
        action = self._parse(reply)
        if action is None:
            truncated = self._steps >= self.config.max_steps
            metrics = {"action_valid": 0.0}
            info = {"action_valid": False, "metrics": metrics}
            return self._text(self._last), self.config.format_penalty, False, truncated, info
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._last = obs
        truncated = bool(truncated) or (not terminated and self._steps >= self.config.max_steps)
        extra = {"action_valid": True, "metrics": {"action_valid": 1.0}, **_plain(info)}
        return self._text(obs), float(reward), bool(terminated), truncated, extra

    @classmethod
    def describe(cls, config: GymConfig) -> EnvSpec:
        probe = cls(config)
        first, _ = probe.reset(0)
        low, high = probe.env.unwrapped.reward_range if hasattr(probe.env.unwrapped, "reward_range") else (-1, 1)
        finite = [v for v in (float(low), float(high), config.format_penalty) if np.isfinite(v)]
        probe.close()
        return EnvSpec(
            env_id=PREFIX + cls.gym_id,
            version="gymnasium-" + _import_gymnasium().__version__,
            instruction=f"You are acting in the Gymnasium environment {cls.gym_id}.\n{probe._legal()}",
            action_format=probe._legal(),
            example_action="<answer>0</answer>" if hasattr(probe._space, "n") else "<answer>text</answer>",
            max_steps=config.max_steps,
            reward_min=min(finite) if np.isfinite(float(low)) else -1e9,
            reward_max=max(finite) if np.isfinite(float(high)) else 1e9,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=("action_valid",),
        )


_HIGHLIGHT = re.compile(r"\x1b\[[0-9;]*m([^\x1b]*)\x1b\[0m")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _plain_ansi(text: str) -> str:
    """Colour-marked cells (e.g. FrozenLake's agent) become ``[x]``; other colour codes are dropped."""
    return _ESCAPE.sub("", _HIGHLIGHT.sub(r"[\1]", text))


def _plain(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-representable scalars of a Gymnasium info dict."""
    out = {}
    for key, value in info.items():
        value = _jsonable(value)
        if isinstance(value, str | int | float | bool):
            out[str(key)] = value
    return out


def _entry(env_id: str) -> EnvEntry:
    gym_id = env_id[len(PREFIX) :]
    gymnasium = _import_gymnasium()
    if gym_id not in gymnasium.registry:
        raise KeyError(f"unknown Gymnasium id '{gym_id}'")
    env_cls = type(f"Gym[{gym_id}]", (GymTextEnv,), {"gym_id": gym_id})
    return EnvEntry(env_id, env_cls, GymConfig)


register_prefix(PREFIX, _entry)
