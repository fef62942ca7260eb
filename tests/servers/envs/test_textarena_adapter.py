"""TextArena's single-player games served over our protocol (ids ``textarena:...``, the real `textarena`
package): a game won through the client, invalid moves, per-session RNG isolation, the conformance suite, the
trainer's first prompt (the rules and the episode's own board, once each), games whose messages and rewards need
normalising, and the games that cannot run here named in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
from support.conformance import conforms
from support.rng_isolation import plays_alone_and_interleaved
from support.servers import start_server

from env_servers.envs.textarena_adapter import TextArenaConfig
from env_servers.registry import get_env
from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings
from roll_lightning.rollout.episodes.episode import Episode, EpisodeBuilder

GUESS, MINES, HANOI = "textarena:GuessTheNumber-v0", "textarena:Minesweeper-v0-small", "textarena:TowerOfHanoi-v0"


async def test_guess_the_number_is_won_by_bisection_through_the_client() -> None:
    server = start_server(env_ids=(GUESS, HANOI))
    try:
        async with EnvPool([server.address]) as pool:
            session = await pool.open(GUESS)
            await session.reset(seed=11)  # the range is in the rules, which are the spec's instruction
            low, high = map(int, re.search(r"between (\d+) and (\d+)", session.spec.instruction).groups())
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
    with pytest.raises(KeyError, match=r"not a single-player game \(it keeps a FFAMultiPlayerState\)"):
        get_env("textarena:PublicGoodsGame-v0")  # it takes one player, then its first step never returns
    with pytest.raises(KeyError, match=r"needs NLTK data that is not installed \(words\): python -m nltk.downloader"):
        get_env("textarena:Wordle-v0")  # its word lists are a download away, and this machine is offline


LIGHTS = "textarena:LightsOut-v0"


async def test_the_first_prompt_shows_the_rules_and_the_episodes_own_board_once(tokenizer: Any) -> None:
    """Before: the instruction was seed 0's first observation (rules and board), so the prompt showed that board
    above the episode's own one, and the format line read "e.g. [5], e.g. [1]"."""
    server = start_server(env_ids=(LIGHTS,))
    try:
        async with EnvPool([server.address]) as pool:
            session = await pool.open(LIGHTS)
            boards = {seed: (await session.reset(seed=seed)).observation for seed in (0, 7)}
            assert boards[0] != boards[7] and boards[7].startswith("Current grid state")
            builder = EpisodeBuilder(tokenizer, EpisodeSettings(), session.spec, Episode(0, 0, 7, LIGHTS), set())
            builder.start(await session.reset(seed=7))
            assert builder.next_request() is not None
            (prompt,) = [m["content"] for m in builder.history.messages if m["role"] == "user"]
            assert prompt.count("Welcome to Lights Out!") == 1 and prompt.count("Current grid state") == 1, prompt
            assert boards[7] in prompt and boards[0] not in prompt, prompt
            assert prompt.count("e.g.") == 1 and f"e.g. {session.spec.example_action}." in prompt, prompt
            moved = await session.step(session.spec.example_action)  # the example is a move the game accepts
            assert moved.action_valid and not moved.terminated, moved.observation
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("game", "opening"),
    [("Countdown-v0", ["[0 1 +]"]), ("Cryptarithm-v0", []), ("Slitherlink-v0", ["[h 0 0]", "[v 0 0]"])],
)
def test_games_with_odd_message_tuples_and_string_rewards_play_to_the_end(game: str, opening: list[str]) -> None:
    """These games send the move's echo as (kind, sender, text) and put the reason where the reward goes when
    invalid moves end the game; before, every step raised "'int' object has no attribute 'strip'"."""
    env = get_env(f"textarena:{game}").env_cls(TextArenaConfig())
    first, _ = env.reset(3)
    assert first and env.describe(TextArenaConfig()).example_action
    for move in opening:
        observation, reward, done, _, info = env.step(move)
        assert info["action_valid"] and not done and observation
    env.step("no move")
    observation, reward, done, _, info = env.step("still no move")
    assert done and reward == -1.0 and not info["action_valid"], (observation, reward, info)
    assert info["reason"] and isinstance(reward, float)


def test_a_game_the_adapter_cannot_play_is_refused_when_the_server_starts() -> None:
    """The id is probed (two resets and a move) when the server resolves it, so a game that would fail every
    episode ends `serve` with one line naming why."""
    with pytest.raises(KeyError, match=r"not a single-player game \(it keeps a TwoPlayerState\)"):
        get_env("textarena:SpiteAndMalice-v0")  # it resets once with one player, then raises inside TextArena
    command = [sys.executable, "-m", "env_servers", "serve", "textarena:Debate-v0", "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OPENROUTER_API_KEY": ""})
    (line,) = [x for x in done.stderr.splitlines() if not x.startswith("[nltk_data]")]
    assert done.returncode == 2 and line.startswith("error: 'textarena:Debate-v0' needs an API key: "), done.stderr
