"""FrozenLake env: maps, Gymnasium as a transition oracle, render, invalid replies, truncation, config errors."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_servers.api import ConfigError, parse_config
from env_servers.envs.frozenlake import ACTIONS, FrozenLakeConfig, FrozenLakeEnv, generate_map, render, transitions
from env_servers.registry import get_env

gymnasium = pytest.importorskip("gymnasium")
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as GymFrozenLake  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


def make_env(**overrides) -> FrozenLakeEnv:
    return FrozenLakeEnv(FrozenLakeConfig(**overrides))


def find(desc, letter):
    return next((r, row.index(letter)) for r, row in enumerate(desc) if letter in row)


def oracle(desc, slippery, success_rate=1 / 3):
    """Gymnasium's transition table, merged per next state (it lists one entry per slip direction)."""
    env = GymFrozenLake(desc=list(desc), is_slippery=slippery, success_rate=success_rate)
    table = {}
    for s, by_action in env.P.items():
        for a, outcomes in by_action.items():
            merged = defaultdict(float)
            for prob, s2, _reward, _done in outcomes:
                if prob > 0:
                    merged[s2] += prob
            table[s, a] = dict(merged)
    return table


@pytest.mark.parametrize(
    ("size", "start_goal", "slippery", "success_rate"),
    [
        (4, "random", False, 1 / 3),
        (4, "random", True, 1 / 3),
        (8, "corners", True, 1 / 3),
        (6, "random", True, 0.8),
        (5, "corners", True, 1.0),
    ],
)
def test_transitions_match_gymnasium(size, start_goal, slippery, success_rate):
    for seed in range(5):
        desc = generate_map(size, 0.8, seed, start_goal)
        expected = oracle(desc, slippery, success_rate)
        for r in range(size):
            for c in range(size):
                for a in range(4):
                    ours = transitions(desc, r, c, a, slippery, success_rate)
                    assert sum(p for p, _, _ in ours) == pytest.approx(1.0)
                    got = {rr * size + cc: p for p, rr, cc in ours}
                    want = expected[r * size + c, a]
                    assert got.keys() == want.keys(), (desc, r, c, a)
                    for s2 in got:
                        assert got[s2] == pytest.approx(want[s2])


def test_deterministic_episodes_match_gymnasium():
    rng = random.Random(0)
    for seed in range(20):
        env = make_env(max_steps=30)
        obs, _ = env.reset(seed)
        desc = generate_map(4, 0.8, seed)
        gym_env = GymFrozenLake(desc=list(desc), is_slippery=False)
        s, _ = gym_env.reset(seed=seed)
        assert s == find(desc, "S")[0] * 4 + find(desc, "S")[1]
        while True:
            a = rng.randrange(4)
            obs, reward, terminated, truncated, info = env.step(f"<answer>{ACTIONS[a]}</answer>")
            s2, gym_reward, gym_terminated, _, _ = gym_env.step(a)
            assert render(desc, s2 // 4, s2 % 4) == obs
            assert (reward, terminated) == (float(gym_reward), gym_terminated)
            assert info["metrics"]["action_effective"] == float(s2 != s)
            assert info["metrics"]["success"] == float(desc[s2 // 4][s2 % 4] == "G")
            s = s2
            if terminated or truncated:
                break


def test_maps_are_solvable_and_respect_start_goal_mode():
    for seed in range(40):
        desc = generate_map(4, 0.6, seed)
        flat = "".join(desc)
        assert flat.count("S") == 1 and flat.count("G") == 1 and set(flat) <= set("SFHG")
        # Every generated map must have a hole-free path; walk the non-slippery model to find one.
        start, seen, stack = find(desc, "S"), set(), [find(desc, "S")]
        while stack:
            cell = stack.pop()
            if cell in seen or desc[cell[0]][cell[1]] == "H":
                continue
            seen.add(cell)
            stack.extend((r, c) for a in range(4) for _, r, c in transitions(desc, *cell, a, False))
        assert find(desc, "G") in seen and start in seen
        corners = generate_map(6, 0.8, seed, "corners")
        assert corners[0][0] == "S" and corners[-1][-1] == "G"
    assert len({generate_map(4, 0.8, seed) for seed in range(30)}) >= 25


def test_same_seed_same_map_across_instances_interleaving_and_processes():
    a, b = make_env(is_slippery=True), make_env(is_slippery=True)
    first, _ = a.reset(42)
    b.reset(7)
    b.step("<answer>Left</answer>")
    np.random.seed(0)
    random.seed(0)
    assert b.reset(42)[0] == first
    # Same slips too: same seed and replies give the same trajectory.
    replies = [f"<answer>{ACTIONS[i % 4]}</answer>" for i in range(12)]
    assert _play(a, replies) == _play(b, replies)

    code = (
        "from env_servers.envs.frozenlake import FrozenLakeEnv, FrozenLakeConfig\n"
        "env = FrozenLakeEnv(FrozenLakeConfig(size=6))\n"
        "print('\\n=\\n'.join(env.reset(s)[0] for s in (0, 1, 987654321)))"
    )
    env_vars = {**os.environ, "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "5"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env_vars,
        capture_output=True,
        text=True,
        encoding="utf-8",
        check=True,
    )
    env = make_env(size=6)
    assert out.stdout.strip() == "\n=\n".join(env.reset(s)[0] for s in (0, 1, 987654321))


def _play(env, replies):
    trace = []
    for reply in replies:
        obs, reward, terminated, truncated, _ = env.step(reply)
        trace.append((obs, reward))
        if terminated or truncated:
            break
    return trace


def test_render_symbols_hole_goal_and_start():
    desc = ("SFH", "FFF", "GFF")
    env = make_env(max_steps=10)
    obs, _ = env.reset(0, {"map": desc})
    assert obs == "P_O\n___\nG__"
    obs, reward, terminated, _, info = env.step("<answer>Right</answer>")
    assert obs == "_PO\n___\nG__" and reward == 0.0 and not terminated
    obs, reward, terminated, _, info = env.step("<answer>Right</answer>")
    assert obs == "__X\n___\nG__" and reward == 0.0 and terminated and info["metrics"]["success"] == 0.0
    env.reset(0, {"map": desc})
    env.step("<answer>Down</answer>")
    obs, reward, terminated, _, info = env.step("<answer>down</answer>")
    assert obs == "__O\n___\n√__" and reward == 1.0 and terminated and info["metrics"]["success"] == 1.0
    with pytest.raises(RuntimeError):
        env.step("<answer>Up</answer>")


def test_board_and_words_say_where_the_goal_is_and_which_moves_fall_into_a_hole():
    desc = ("SFH", "FHF", "GFF")
    env = make_env(max_steps=10, observation="board+words")
    obs, _ = env.reset(0, {"map": desc})
    assert obs == "P_O\n_O_\nG__\nThe goal is 2 Down of you. No hole is next to you."
    obs, *_ = env.step("<answer>Right</answer>")
    assert obs.endswith("The goal is 2 Down and 1 Left of you. A hole is Down and Right of you.")
    obs, *_ = env.step("<answer>Right</answer>")
    assert obs == "__X\n_O_\nG__\nYou fell into a hole."
    env.reset(0, {"map": desc})
    env.step("<answer>Down</answer>")
    obs, *_ = env.step("<answer>Down</answer>")
    assert obs == "__O\n_O_\n√__\nYou are on the goal."


@pytest.mark.parametrize(
    "reply",
    ["", "Down", "<answer>Jump</answer>", "<answer>Down || Down</answer>", "<answer>" * 50_000, "z" * 1_000_000],
)
def test_invalid_replies_are_penalised_noops(reply):
    env = make_env()
    obs, _ = env.reset(0, {"map": ("SFF", "FFF", "FFG")})
    obs2, reward, terminated, truncated, info = env.step(reply)
    assert obs2 == obs and reward == pytest.approx(-0.01) and not terminated and not truncated
    assert info["action_valid"] is False and info["metrics"] == {
        "action_valid": 0.0,
        "action_effective": 0.0,
        "success": 0.0,
    }


@pytest.mark.parametrize(
    ("reply", "moved_to"),
    [
        ("Right", (0, 1)),
        ("down", (1, 0)),
        ("<answer>Right</answer>", (0, 1)),
        ("um Down Right", (1, 0)),  # the first action word wins
        ("Upright", (0, 0)),  # a word, not a substring: no action, a penalised no-op
        ("", (0, 0)),
    ],
)
def test_lenient_parse_takes_the_first_action_word(reply, moved_to):
    env = make_env(lenient=True, format_penalty=-0.1)
    env.reset(0, {"map": ("SFF", "FFF", "FFG")})
    _, reward, _, _, info = env.step(reply)
    assert env._pos == moved_to
    assert info["action_valid"] is (moved_to != (0, 0))
    assert reward == (0.0 if info["action_valid"] else pytest.approx(-0.1))
    spec = FrozenLakeEnv.describe(env.config)
    assert "<answer>" not in spec.instruction and spec.example_action == "Left"


def test_truncation_at_max_steps():
    env = make_env(max_steps=3)
    env.reset(0, {"map": ("SFF", "FFF", "FFG")})
    results = [env.step(r) for r in ("<answer>Up</answer>", "bad", "<answer>Left</answer>")]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)
    assert results[0][4]["metrics"]["action_effective"] == 0.0  # walking off the edge stays put


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"size": 1}, "size"),
        ({"frozen_prob": 0.0}, "frozen_prob"),
        ({"frozen_prob": 1.5}, "frozen_prob"),
        ({"success_rate": -0.1}, "success_rate"),
        ({"start_goal": "middle"}, "start_goal"),
        ({"max_steps": 0}, "max_steps"),
        ({"format_penalty": 1}, "format_penalty"),
        ({"is_slippery": "yes"}, "is_slippery"),
        ({"lenient": "yes"}, "lenient"),
        ({"observation": "pixels"}, "observation"),
    ],
)
def test_config_errors_name_the_field(values, field):
    with pytest.raises(ConfigError, match=field):
        parse_config(FrozenLakeConfig, values, env_id="frozenlake")


def test_registry_and_describe():
    entry = get_env("frozenlake")
    config = entry.make_config({"size": 5, "is_slippery": True})
    spec = entry.describe(config)
    assert spec.env_id == "frozenlake" and spec.reward_max == 1.0 and spec.reward_min == pytest.approx(-0.01)
    assert "slippery" in spec.instruction and "<answer>" in spec.instruction
    obs, info = entry.make(config).reset(1)
    assert len(obs.split("\n")) == 5 and obs.count("P") == 1 and obs.count("G") == 1


_FRAGMENTS = st.sampled_from(["<answer>", "</answer>", "Up", "down", "LEFT", "right", "||", " ", "\n", "√"])


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    slippery=st.booleans(),
    replies=st.lists(st.lists(_FRAGMENTS | st.text(max_size=8)).map("".join), max_size=12),
)
def test_random_replies_never_crash(seed, slippery, replies):
    env = make_env(max_steps=8, is_slippery=slippery)
    env.reset(seed)
    for reply in replies:
        obs, reward, terminated, truncated, info = env.step(reply)
        assert isinstance(obs, str) and reward in (0.0, 1.0, -0.01)
        if terminated or truncated:
            break
