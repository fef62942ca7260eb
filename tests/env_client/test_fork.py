"""`EnvSession.fork` against a real server (issue 49): copies continue the episode at its step, each answers as
the original would, closing them frees their places, and a fork the server or env cannot make is refused by name
before any call."""

from __future__ import annotations

import pytest
import support.fork_envs  # noqa: F401  (registers the trail envs)
from support.misbehaving import UnaryOnly, start_misbehaving
from support.servers import start_server

from roll_lightning.env_client import EnvPool, EpisodeFailed

MOVES = ["<answer>Left</answer>", "<answer>Down</answer>", "<answer>Right</answer>", "bad", "<answer>Up</answer>"]


async def answers(session, moves: list[str]) -> list[tuple]:
    out = []
    for move in moves:
        step = await session.step(move)
        out.append((step.observation, step.reward, step.terminated, step.truncated, step.action_valid, step.metrics))
        if step.done:
            break
    return out


async def test_copies_continue_the_episode_as_the_original_would() -> None:
    running = start_server(env_ids=("frozenlake",), max_sessions=16)
    try:
        async with EnvPool([running.address]) as pool:
            original = await pool.open("frozenlake", {"is_slippery": True, "max_steps": 20})
            await original.reset(seed=5)
            await original.step(MOVES[0])
            copies = await original.fork(2)
            assert [c.step_index for c in copies] == [1, 1] and len({c.session_id for c in copies}) == 2
            assert all(c.episode_id and c.episode_id != original.episode_id for c in copies)
            assert pool.stats["forks"] == 1 and pool.stats["forked_sessions"] == 2
            expected = await answers(original, MOVES * 3)
            assert await answers(copies[0], MOVES * 3) == expected == await answers(copies[1], MOVES * 3)
            before = (await pool.endpoints[0].client.server_info()).active_sessions
            for copy in copies:
                await copy.close()
            assert (await pool.endpoints[0].client.server_info()).active_sessions == before - 2
            await original.close()
    finally:
        running.stop()


async def test_a_fork_that_cannot_be_made_is_refused_by_name() -> None:
    plain, unary = start_server(env_ids=("trail-fixed",)), start_misbehaving(UnaryOnly, env_ids=("trail",))
    try:
        async with EnvPool([plain.address]) as pool:
            session = await pool.open("trail-fixed")
            with pytest.raises(EpisodeFailed, match=r"fork\(\) before reset\(\)"):
                await session.fork(1)
            await session.reset(seed=1)
            unforkable = "env 'trail-fixed' cannot be forked: its spec says forkable: false"
            with pytest.raises(EpisodeFailed, match=unforkable):
                await session.fork(1)
        async with EnvPool([unary.address]) as pool:
            session = await pool.open("trail")
            await session.reset(seed=1)
            with pytest.raises(EpisodeFailed, match='the server does not advertise "fork"'):
                await session.fork(1)
            assert pool.stats["forks"] == 0
    finally:
        plain.stop()
        unary.stop()
