"""TextArena's single-player games served over our protocol (ids ``textarena:...``, the real `textarena`
package): a game won through the client, invalid moves, per-session RNG isolation, the conformance suite, and
the games that cannot run here named in one line."""

from __future__ import annotations

import re

import pytest
from support.conformance import conforms
from support.rng_isolation import plays_alone_and_interleaved
from support.servers import start_server

from env_servers.registry import get_env
from roll_lightning.env_client import EnvPool

GUESS, MINES, HANOI = "textarena:GuessTheNumber-v0", "textarena:Minesweeper-v0-small", "textarena:TowerOfHanoi-v0"


async def test_guess_the_number_is_won_by_bisection_through_the_client() -> None:
    server = start_server(env_ids=(GUESS, HANOI))
    try:
        async with EnvPool([server.address]) as pool:
            session = await pool.open(GUESS)
            first = await session.reset(seed=11)
            low, high = map(int, re.search(r"between (\d+) and (\d+)", first.observation).groups())
            for _ in range(10):
                guess = (low + high) // 2
                out = await session.step(f"My guess is [{guess}].")
                assert out.action_valid
                if out.terminated:
                    break
                assert out.reward == 0.0 and out.observation in (
                    "The target number is higher.",
                    "The target number is lower.",
                )
                low, high = (guess + 1, high) if "higher" in out.observation else (low, guess - 1)
            assert out.terminated and out.reward == 1.0 and out.metrics["success"] == 1.0 and out.metrics["turns"] >= 1
            hanoi = await pool.open(HANOI)
            await hanoi.reset(seed=0)
            moved = await hanoi.step("[A C]")
            assert moved.action_valid and "C: [1]" in moved.observation, "each observation is only what is new"
            warned = await hanoi.step("no move")
            assert not warned.action_valid and not warned.terminated, "TextArena allows one invalid move ..."
            ended = await hanoi.step("still no move")
            assert not ended.action_valid and ended.terminated and "Invalid Move" in ended.observation, "... not two"
    finally:
        server.stop()


def test_sessions_do_not_share_textarenas_global_rng() -> None:
    # Minesweeper places its mines with the process-global `random` after the first reveal.
    alone, interleaved = plays_alone_and_interleaved(MINES, ["[2 2]", "[0 0]", "[4 4]", "[0 4]"])
    assert interleaved == alone


@pytest.mark.parametrize("env_id", [GUESS, MINES])
def test_conformance_passes_on_textarena_games(env_id: str) -> None:
    server, second = start_server(env_ids=(env_id,)), start_server(env_ids=(env_id,))
    try:
        conforms(server.address, env_id, second=second.address, garbage="no move")
    finally:
        server.stop()
        second.stop()


def test_games_that_cannot_train_here_are_named_in_one_line() -> None:
    with pytest.raises(KeyError, match="unknown TextArena id 'NoSuchGame-v0'"):
        get_env("textarena:NoSuchGame-v0")
    with pytest.raises(KeyError, match="not a single-player game"):
        get_env("textarena:ConnectFour-v0")
    with pytest.raises(KeyError, match=r"needs NLTK data that is not installed \(words\): python -m nltk.downloader"):
        get_env("textarena:Wordle-v0")  # its word lists are a download away, and this machine is offline
