"""The TextArena games table in docs/environments.md: `env_servers.envs.textarena_games` run on a subset with one
game of each kind (the whole registry takes minutes), and the table in the docs agrees with what it finds."""

from __future__ import annotations

import re
from pathlib import Path

from env_servers.envs.textarena_games import registered_ids, table

DOCS = Path(__file__).resolve().parents[3] / "docs" / "environments.md"
SUBSET = [
    "GuessTheNumber-v0",  # plays
    "Countdown-v0",  # plays since its message tuples and string rewards are normalised
    "Crosswords-v0",  # plays, with no example move that is legal in every episode
    "Wordle-v0",  # needs NLTK data
    "Debate-v0",  # needs an API key
    "SpiteAndMalice-v0",  # takes one player, then raises inside TextArena: a two-player game, not in the table
    "Chess-v0",  # refused: its module does not import
    "ConnectFour-v0",  # two players: not in the table
]


def rows_of(markdown: str) -> dict[str, tuple[str, str]]:
    found = re.findall(r"^\| `([^`]+)` \| ([^|]+) \| (.*) \|$", markdown, re.M)
    return {game: (status.strip(), detail) for game, status, detail in found}


def test_the_table_sorts_a_subset_and_the_docs_hold_the_same_rows() -> None:
    rows = rows_of(table(SUBSET))
    assert {game: status for game, (status, _) in rows.items()} == {
        "GuessTheNumber-v0": "plays",
        "Countdown-v0": "plays",
        "Crosswords-v0": "plays",
        "Wordle-v0": "needs data or a key",
        "Debate-v0": "needs data or a key",
        "Chess-v0": "refused",
    }
    assert rows["GuessTheNumber-v0"][1].startswith("example move `[5]`; the first episode ended after")
    assert rows["Crosswords-v0"][1].startswith("example move none found")
    assert "python -m nltk.downloader words" in rows["Wordle-v0"][1] and "OPENROUTER_API_KEY" in rows["Debate-v0"][1]
    documented = rows_of(DOCS.read_text())
    assert {game: documented.get(game) for game in rows} == rows, "docs/environments.md's table is stale"
    assert set(documented) <= set(registered_ids()) and not {"ConnectFour-v0", "SpiteAndMalice-v0"} & set(documented)
