"""Gymnasium envs served as text envs (`gym:<id>`, the optional [gym] extra)."""

from __future__ import annotations

import pytest

pytest.importorskip("gymnasium", reason="the optional [gym] extra (gymnasium) is not installed")

from env_servers.api import ConfigError  # noqa: E402
from env_servers.registry import get_env  # noqa: E402


def make(env_id: str, **config):
    entry = get_env(env_id)
    return entry.make(entry.make_config(config))


def test_frozenlake_text_board_moves_and_invalid_replies():
    env = make("gym:FrozenLake-v1", make_kwargs='{"is_slippery": false}', format_penalty=-0.5)
    obs, info = env.reset(3)
    assert obs.splitlines()[0] == "[S]FFF" and "\x1b" not in obs, "the agent's cell is marked, colours dropped"
    assert "N in 0..3" in obs and info["seed"] == 3
    obs, reward, terminated, truncated, info = env.step("I go right <answer>2</answer>")
    assert obs.splitlines()[1] == "S[F]FF" and info["action_valid"] and reward == 0.0
    for bad in ("<answer>9</answer>", "right", "<answer>-1</answer>", ""):
        obs2, reward, terminated, _, info = env.step(bad)
        assert not info["action_valid"] and reward == -0.5 and not terminated
        assert obs2 == obs, "an invalid reply does not step the env"


def test_non_ansi_envs_show_the_observation_as_json_and_seeds_repeat():
    a, b = make("gym:Blackjack-v1"), make("gym:Blackjack-v1")
    first = a.reset(11)[0]
    assert first.startswith("[") and "N in 0..1" in first
    assert b.reset(11)[0] == first
    assert [a.step("<answer>0</answer>")[:4] for _ in range(1)] == [b.step("<answer>0</answer>")[:4]]


def test_truncation_and_bad_ids_or_configs():
    env = make("gym:FrozenLake-v1", max_steps=2, make_kwargs='{"is_slippery": false}')
    env.reset(0)
    assert not env.step("<answer>0</answer>")[3]
    assert env.step("<answer>0</answer>")[3], "max_steps truncates"
    with pytest.raises(KeyError, match="unknown Gymnasium id 'NoSuch-v0'"):
        get_env("gym:NoSuch-v0")
    with pytest.raises(ConfigError, match="make_kwargs"):
        get_env("gym:FrozenLake-v1").make_config({"make_kwargs": "[1]"})
