"""Gymnasium envs served as text envs (`gym:<id>`, the optional [gym] extra)."""

from __future__ import annotations

import pytest

gymnasium = pytest.importorskip("gymnasium", reason="the optional [gym] extra (gymnasium) is not installed")

from support.servers import start_server  # noqa: E402

from env_servers.api import ConfigError  # noqa: E402
from env_servers.registry import get_env  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402


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


class CountedEnv(gymnasium.Env):
    """A one-step Gymnasium env that counts how many instances are open, to see the server release them."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    open_now = 0

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.action_space = gymnasium.spaces.Discrete(2)
        self.observation_space = gymnasium.spaces.Discrete(2)
        type(self).open_now += 1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action: int):
        return 1, float(action), True, False, {}

    def render(self) -> str:
        return "board"

    def close(self) -> None:
        type(self).open_now -= 1


COUNTED = "RollTest/Counted-v0"
gymnasium.register(COUNTED, entry_point=CountedEnv)


async def test_the_server_closes_the_gymnasium_envs_it_makes():
    running = start_server(env_ids=("gym:" + COUNTED,), max_sessions=4)
    try:
        assert CountedEnv.open_now == 0, "the start-up probe and describe's probe are closed"
        async with EnvPool([running.address]) as pool:
            kept, ended = await pool.open("gym:" + COUNTED), await pool.open("gym:" + COUNTED)
            await kept.reset(seed=1)
            assert (await ended.reset(seed=2)).observation.startswith("board")
            assert (await ended.step("<answer>1</answer>")).reward == 1.0
            assert CountedEnv.open_now == 2, "one env per session (the ANSI remake closed the first)"
            await ended.close()
            assert CountedEnv.open_now == 1, "closing a session closes its env"
    finally:
        running.stop()
    assert CountedEnv.open_now == 0, "stopping the server closes the sessions still open"
