"""Which TextArena single-player games train here: a markdown table for docs/environments.md.

    python -m env_servers.envs.textarena_games [ID ...]

Each registered id (its ``-train`` and ``-raw`` twins name the same game) is resolved as ``serve`` resolves it;
multi-player games are left out. A game that loads plays its first episode (seed 0) with the spec's example
move, repeated until the game or ``max_steps`` ends it; it is in "plays" only if that episode ran without error.
All ids take a few minutes (Sokoban-v0-medium and Sudoku-v0-hard build their boards slowly).
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass

from env_servers.envs.textarena_adapter import PREFIX, TextArenaConfig, refusal
from env_servers.registry import get_env

_TWINS = ("-train", "-raw")


@dataclass(frozen=True)
class GameRow:
    game_id: str
    status: str  # "plays", "needs data or a key", or "refused"
    detail: str  # the example move and the first episode's turns, or why it cannot play

    def markdown(self) -> str:
        return f"| `{self.game_id}` | {self.status} | {self.detail.replace('|', '/')} |"


def registered_ids() -> list[str]:
    """Every TextArena id that is not a ``-train`` or ``-raw`` twin of another."""
    from env_servers.envs.textarena_adapter import _import_textarena

    registry = _import_textarena().envs.registration.ENV_REGISTRY
    return sorted(game for game in registry if not game.endswith(_TWINS))


def _needs(message: str) -> bool:
    return "needs NLTK data" in message or "needs an API key" in message or "lacks a data file" in message


def classify(game_id: str) -> GameRow | None:
    """The row for ``game_id``, or None for a multi-player game."""
    try:
        entry = get_env(PREFIX + game_id)
    except KeyError as exc:
        message = str(exc.args[0])
        if "is not a single-player game" in message:
            return None
        return GameRow(game_id, "needs data or a key" if _needs(message) else "refused", message)
    config = TextArenaConfig()
    try:
        example = entry.env_cls.describe(config).example_action
        env = entry.env_cls(config)
        env.reset(0)
        turns, over = 0, False
        while not over:
            _, _, done, truncated, _ = env.step(example or "[1]")
            turns, over = turns + 1, done or truncated
    except Exception as exc:
        return GameRow(game_id, "refused", f"its first episode fails: {refusal(PREFIX + game_id, exc)}")
    move = f"`{example}`" if example else "none found"
    return GameRow(game_id, "plays", f"example move {move}; the first episode ended after {turns} turns")


def table(game_ids: list[str]) -> str:
    """The markdown table of ``game_ids``' single-player games."""
    rows = []
    for game in game_ids:
        print(f"{game} ...", file=sys.stderr, flush=True)  # progress: a few games take a minute
        with contextlib.redirect_stdout(io.StringIO()):  # some games print as they play
            row = classify(game)
        rows += [row] if row is not None else []
    head = "| Id | Status | Example move, or why not |\n|---|---|---|"
    return "\n".join([head, *(row.markdown() for row in rows)])


def main(argv: list[str]) -> int:
    print(table(argv or registered_ids()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
