"""Serve TextArena's single-player games over our protocol: ids ``textarena:<TextArena id>``.

    python -m env_servers serve textarena:GuessTheNumber-v0 textarena:Minesweeper-v0-small

Played as player 0 without TextArena's wrappers: the spec's instruction is the game's rules, and each observation
is only what the game said since the agent's last move. The mapping is in docs/environments.md.
"""

from __future__ import annotations

import copy
import functools
import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import EnvSpec, json_object, package_version
from env_servers.envs.global_rng import GlobalRng
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "textarena:"
# Moves to try for the spec's example after the rules' own bracketed ones (often placeholders such as "[row col]",
# or moves illegal on the seed-0 board); each is played at seed 0 and kept only if the game accepts it.
_DIGITS = range(1, 10)
_EXAMPLES: dict[str, list[str]] = {
    "Minesweeper": ["[0 0]"],
    "LightsOut": ["[0 0]"],
    "Bandit": ["[red]"],
    "FifteenPuzzle": ["[up]", "[down]", "[left]", "[right]"],
    "ThreeCardMonte": ["[0]", "[1]", "[2]"],
    "Slitherlink": ["[h 0 0]", "[v 0 0]"],
    "Mastermind": ["[1 2 3 4]", "[1 2 3 4 5]", "[1 2 3 4 5 6]"],
    "PegJump": [f"[{a} {b}]" for a in range(1, 16) for b in range(1, 16)],
    "Cryptarithm": [f"[{letter} {d}]" for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" for d in _DIGITS],
    "Sudoku": [f"[{r} {c} {n}]" for r in _DIGITS for c in _DIGITS for n in _DIGITS],
}
_FIRST_MOVE = "Make your first move."  # the first observation when the game showed nothing but its rules
_INVALID_REWARD = -1.0  # TextArena's reward for a game lost to invalid moves (SinglePlayerState.set_invalid_move)


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


def _messages(raw: list[tuple[Any, ...]]) -> list[tuple[Any, str]]:
    """TextArena's message tuples as (kind, text): most are (sender, text, kind), some games' (kind, sender, text)."""
    kinds = _import_textarena().ObservationType
    out = []
    for message in raw:
        kind = next((part for part in message if isinstance(part, kinds)), None)
        text = next((part for part in message if isinstance(part, str)), "")
        out.append((kind, text.strip("\n").rstrip()))  # a board's first line keeps its indent
    return out


def _reward(value: Any) -> tuple[float, str]:
    """A game's end reward as a number, and the reason when it was not one: some games (Countdown, Cryptarithm,
    Slitherlink) call ``set_invalid_move`` with its arguments swapped, so their invalid-move loss has the reason as
    reward."""
    try:
        return float(value), ""
    except (TypeError, ValueError):
        return _INVALID_REWARD, str(value)


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

    def _news(self) -> list[tuple[Any, str]]:
        """What the game told player 0 since the last call, without the echo of its move."""
        ta = _import_textarena()
        _, raw = self.env.get_observation()
        return [(kind, text) for kind, text in _messages(raw) if kind != ta.ObservationType.PLAYER_ACTION and text]

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._steps = 0
        try:
            self.rng.run(self.env.reset, num_players=1, seed=seed)
        except LookupError as exc:
            raise RuntimeError(_missing_data(self.game_id, exc)) from exc
        news = self._news()
        rules = _probe(type(self), self.config.make_kwargs).rules
        if rules and _rules_of(news) == rules:  # the rules are the spec's instruction: the board alone follows
            news = [(kind, text) for kind, text in news if kind != _import_textarena().ObservationType.PROMPT]
        return "\n".join(text for _, text in news) or _FIRST_MOVE, {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, _ = self.rng.run(self.env.step, action)
        self._steps += 1
        state = self.env.state
        ending = state.game_info[0] if done else {}
        invalid = bool(ending.get("invalid_move")) if done else getattr(state, "error_count", 0) > 0
        reward, why = _reward((state.rewards or {}).get(0, 0.0)) if done else (0.0, "")
        metrics = {"action_valid": float(not invalid), "success": float(done and reward >= 1.0)}
        info: dict[str, Any] = {"action_valid": not invalid, "metrics": metrics}
        if done:
            metrics["turns"] = float(self._steps)
            info["reason"] = why or str(ending.get("reason", ""))
        truncated = not done and self._steps >= self.config.max_steps
        news = "\n".join(text for _, text in self._news())
        return news or info.get("reason", ""), reward, bool(done), truncated, info

    @classmethod
    def describe(cls, config: TextArenaConfig) -> EnvSpec:
        probe = _probe(cls, config.make_kwargs)
        return EnvSpec(
            env_id=PREFIX + cls.game_id,
            version=f"textarena-{package_version('textarena')}",
            instruction=probe.rules or f"You play TextArena's {cls.game_id}; the game states its rules as it starts.",
            action_format="free text; the game reads the move in square brackets",
            example_action=probe.example,
            max_steps=config.max_steps,
            reward_min=-1.0,
            reward_max=1.0,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=("action_valid", "success", "turns"),
        )


def _rules_of(news: list[tuple[Any, str]]) -> str:
    prompt = _import_textarena().ObservationType.PROMPT
    return "\n".join(text for kind, text in news if kind == prompt)


@dataclass(frozen=True)
class _Probe:
    rules: str  # the game's rules when no seed changes them (else "": each first observation carries its own)
    example: str  # a move the game accepts at seed 0, "" when none was found


@functools.cache
def _probe(cls: type[TextArenaEnv], make_kwargs: str) -> _Probe:
    """Play the game at seeds 1 and 0: its rules if they are the same at both, and the first bracketed move from
    them (or `_EXAMPLES`) that the game accepts at seed 0."""
    env = cls(TextArenaConfig(make_kwargs=make_kwargs))
    env.rng.run(env.env.reset, num_players=1, seed=1)
    state = type(env.env.state)
    if not issubclass(state, _import_textarena().state.SinglePlayerState):  # some N-player games take 1, then hang
        raise AssertionError(f"it keeps a {state.__name__}")
    other = _rules_of(env._news())
    env.rng.run(env.env.reset, num_players=1, seed=0)
    rules = _rules_of(env._news())
    family = cls.game_id.split("-")[0]
    candidates = [*re.findall(r"\[[^\[\]\n]{1,40}\]", rules), *_EXAMPLES.get(family, [])]
    for move in dict.fromkeys(candidates):
        trial = copy.deepcopy(env.env)
        done, _ = env.rng.run(trial.step, move)
        state = trial.state
        if not (state.game_info[0].get("invalid_move") if done else getattr(state, "error_count", 0) > 0):
            return _Probe(rules if rules == other else "", move)
    return _Probe(rules if rules == other else "", "")


def _missing_data(game_id: str, exc: LookupError) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Resource (\S+) not found", plain)
    resource = found.group(1) if found else "see its message"
    return (
        f"textarena:{game_id} needs NLTK data that is not installed ({resource}): "
        f"python -m nltk.downloader {resource if found else '<resource>'}"
    )


def refusal(env_id: str, exc: BaseException) -> str:
    """Why a TextArena id cannot train here, in one line, from what its probe raised."""
    text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, AssertionError) or (isinstance(exc, ValueError) and "player" in text.lower()):
        return f"'{env_id}' is not a single-player game ({text}); only single-player games train here"
    if isinstance(exc, (ImportError, SyntaxError)):
        return f"'{env_id}': TextArena's module for it does not import here ({type(exc).__name__}: {text[:80]})"
    if "API key" in text:
        return f"'{env_id}' needs an API key: {text}"
    if isinstance(exc, FileNotFoundError):
        return f"'{env_id}': the installed textarena package lacks a data file the game reads ({exc.filename})"
    if isinstance(exc, RuntimeError) and "NLTK" in text:
        return text
    if isinstance(exc, LookupError) and not isinstance(exc, (KeyError, IndexError)):  # NLTK's missing resource
        return _missing_data(env_id[len(PREFIX) :], exc)
    return f"'{env_id}': the adapter cannot play it: it raised {type(exc).__name__}({text[:120]!r})"


def _entry(env_id: str) -> EnvEntry:
    game_id = env_id[len(PREFIX) :]
    if not game_id:
        raise KeyError(f"'{env_id}': name a TextArena id after 'textarena:', e.g. textarena:GuessTheNumber-v0")
    registry = _import_textarena().envs.registration.ENV_REGISTRY
    if game_id not in registry:
        raise KeyError(f"unknown TextArena id '{game_id}'")
    env_cls = type(f"TextArena[{game_id}]", (TextArenaEnv,), {"game_id": game_id})
    try:  # a reset at two seeds and a move: a game that cannot be played is refused now, not in every episode
        _probe(env_cls, TextArenaConfig().make_kwargs)
    except Exception as exc:
        raise KeyError(refusal(env_id, exc)) from exc
    return EnvEntry(env_id, env_cls, TextArenaConfig)


register_prefix(PREFIX, _entry)
