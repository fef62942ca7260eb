"""GEM games served over our protocol (the optional gem-llm extra), with per-session RNG isolation."""

from __future__ import annotations

import re

import pytest

gem = pytest.importorskip("gem", reason="the optional gem-llm extra is not installed (needs Python <= 3.12.0)")

from support.rng_isolation import plays_alone_and_interleaved  # noqa: E402
from support.servers import start_server  # noqa: E402

from env_servers.api import ConfigError  # noqa: E402
from env_servers.registry import get_env  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402

GUESS, MINES, G2048 = "gem:game:GuessTheNumber-v0-easy", "gem:game:Minesweeper-v0-easy", "gem:game:Game2048-v0-easy"


async def test_guess_the_number_is_won_by_bisection_through_the_client():
    running = start_server(env_ids=(GUESS, MINES))
    try:
        async with EnvPool([running.address]) as pool:
            session = await pool.open(GUESS)
            first = await session.reset(seed=11)
            low, high = map(int, re.search(r"between (\d+) and (\d+)", first.observation).groups())
            for _ in range(session.spec.max_steps):
                guess = (low + high) // 2
                out = await session.step(f"My guess: \\boxed{{{guess}}}")
                assert out.action_valid
                if "lower" in out.observation:
                    high = guess - 1
                elif "higher" in out.observation:
                    low = guess + 1
                else:
                    break
            assert out.terminated and out.reward == 1.0 and out.metrics["success"] == 1.0
            mines = await pool.open(MINES)
            board = await mines.reset(seed=2)
            assert "board" in board.observation.lower(), "GEM's info['suffix'] (the board) is part of the observation"
            bad = await mines.step("no boxed answer here")
            assert not bad.action_valid and bad.terminated, "GEM ends the episode on a format error"
    finally:
        running.stop()


def test_sessions_do_not_share_gems_global_rng():
    # GEM's 2048 spawns tiles from the process-global RNG: interleaved sessions used to diverge (envs.md §2).
    moves = ["\\boxed{up}", "\\boxed{left}", "\\boxed{down}", "\\boxed{right}"] * 3
    alone, interleaved = plays_alone_and_interleaved(G2048, moves)
    assert interleaved == alone


def test_bad_gem_ids_and_configs_are_named():
    with pytest.raises(KeyError, match="unknown GEM id 'game:NoSuchGame'"):
        get_env("gem:game:NoSuchGame")
    with pytest.raises(ConfigError, match="make_kwargs"):
        get_env(GUESS).make_config({"make_kwargs": "{not json"})


def test_numpy_scalars_in_gems_info_reach_the_trainer_as_numbers():
    import numpy as np

    from env_servers.envs.gem_adapter import _plain

    info = {"correct": np.bool_(True), "score": np.float64(0.5), "suffix": "the board", "cells": [1, 2]}
    assert _plain(info, skip="suffix") == {"correct": True, "score": 0.5}
