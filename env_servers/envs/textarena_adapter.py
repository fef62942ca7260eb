"""Serve TextArena's single-player games over our protocol: ids ``textarena:<TextArena id>``.

    python -m env_servers serve textarena:GuessTheNumber-v0 textarena:Minesweeper-v0-small

Played as player 0 without TextArena's wrappers: each observation is only what the game said since the agent's
last move. The mapping is in docs/environments.md.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import EnvSpec, json_object, package_version
from env_servers.envs.global_rng import GlobalRng
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "textarena:"
# A legal-looking first move per game family (conformance plays the spec's example action).
_EXAMPLES = {"Minesweeper": "[0 0]", "Sudoku": "[1 1 1]", "TowerOfHanoi": "[A C]", "Mastermind": "[1 2 3 4]"}


@dataclass(frozen=True)
class TextArenaConfig:
    max_steps: int = field(default=50, metadata={"doc": "turns before we truncate (most games have their own)"})
    make_kwargs: str = field(default="{}", metadata={"doc": "JSON object overriding the game's registered kwargs"})

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        json_object(self.make_kwargs, "make_kwargs")


def _import_textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise RuntimeError(
            "TextArena games need the optional textarena package: pip install 'roll_lightning[textarena]'"
        ) from exc
    return textarena


class TextArenaEnv:
    """One TextArena game, played as player 0, under its own `GlobalRng`."""

    game_id = ""

    def __init__(self, config: TextArenaConfig) -> None:
        ta = _import_textarena()
        self.config = config
        spec = ta.envs.registration.ENV_REGISTRY[self.game_id]
        entry = spec.entry_point
        if isinstance(entry, str):
            module, name = entry.split(":")
            entry = getattr(importlib.import_module(module), name)
        self.rng = GlobalRng()
        kwargs = {**spec.kwargs, **json_object(config.make_kwargs, "make_kwargs")}
        try:
            self.env = self.rng.run(entry, **kwargs)
        except LookupError as exc:  # NLTK's "Resource ... not found" (word games)
            raise RuntimeError(_missing_data(self.game_id, exc)) from exc
        self._steps = 0

    def _news(self) -> str:
        """What the game told player 0 since the last call, without the echo of its move."""
        ta = _import_textarena()
        _, messages = self.env.get_observation()
        lines = [text.strip() for _, text, kind in messages if kind != ta.ObservationType.PLAYER_ACTION]
        return "\n".join(line for line in lines if line)

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._steps = 0
        try:
            self.rng.run(self.env.reset, num_players=1, seed=seed)
        except LookupError as exc:
            raise RuntimeError(_missing_data(self.game_id, exc)) from exc
        return self._news(), {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, _ = self.rng.run(self.env.step, action)
        self._steps += 1
        state = self.env.state
        ending = state.game_info[0] if done else {}
        invalid = bool(ending.get("invalid_move")) if done else getattr(state, "error_count", 0) > 0
        reward = float((state.rewards or {}).get(0, 0.0)) if done else 0.0
        metrics = {"action_valid": float(not invalid), "success": float(done and reward >= 1.0)}
        info: dict[str, Any] = {"action_valid": not invalid, "metrics": metrics}
        if done:
            metrics["turns"] = float(self._steps)
            info["reason"] = str(ending.get("reason", ""))
        truncated = not done and self._steps >= self.config.max_steps
        return self._news() or info.get("reason", ""), reward, bool(done), truncated, info

    @classmethod
    def describe(cls, config: TextArenaConfig) -> EnvSpec:
        instruction, _ = cls(config).reset(0)
        family = cls.game_id.split("-")[0]
        return EnvSpec(
            env_id=PREFIX + cls.game_id,
            version=f"textarena-{package_version('textarena')}",
            instruction=instruction,
            action_format="free text; the game reads the move in square brackets, e.g. [5]",
            example_action=_EXAMPLES.get(family, "[1]"),
            max_steps=config.max_steps,
            reward_min=-1.0,
            reward_max=1.0,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=("action_valid", "success", "turns"),
        )


def _missing_data(game_id: str, exc: LookupError) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Resource (\S+) not found", plain)
    resource = found.group(1) if found else "see its message"
    return (
        f"textarena:{game_id} needs NLTK data that is not installed ({resource}): "
        f"python -m nltk.downloader {resource if found else '<resource>'}"
    )


def _entry(env_id: str) -> EnvEntry:
    game_id = env_id[len(PREFIX) :]
    if not game_id:
        raise KeyError(f"'{env_id}': name a TextArena id after 'textarena:', e.g. textarena:GuessTheNumber-v0")
    registry = _import_textarena().envs.registration.ENV_REGISTRY
    if game_id not in registry:
        raise KeyError(f"unknown TextArena id '{game_id}'")
    env_cls = type(f"TextArena[{game_id}]", (TextArenaEnv,), {"game_id": game_id})
    try:
        probe = env_cls(TextArenaConfig())
        probe.rng.run(probe.env.reset, num_players=1, seed=0)
    except AssertionError as exc:  # the multi-player states assert their player count
        raise KeyError(f"'{env_id}' is not a single-player game ({exc}); only single-player games train here") from exc
    except (ImportError, SyntaxError) as exc:
        raise KeyError(
            f"'{env_id}': TextArena's module for it does not import here ({type(exc).__name__}: {str(exc)[:80]})"
        ) from exc
    except RuntimeError as exc:  # missing NLTK data
        raise KeyError(str(exc)) from exc
    return EnvEntry(env_id, env_cls, TextArenaConfig)


register_prefix(PREFIX, _entry)
