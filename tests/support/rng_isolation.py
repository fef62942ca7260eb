"""`plays_alone_and_interleaved`: an env's episode played alone, and the same episode played while another
session of the same env steps in between (the check that adapters of libraries on the global RNGs isolate
each session's randomness)."""

from __future__ import annotations

from collections.abc import Sequence

from env_servers.registry import get_env


def plays_alone_and_interleaved(env_id: str, moves: Sequence[str], seed: int = 5) -> tuple[list, list]:
    """The observations of one episode of ``env_id`` (seed ``seed``, then ``moves``) played alone, and played
    with another session (seed 99) reset and stepped between each of its calls."""
    entry = get_env(env_id)
    config = entry.make_config({})
    env = entry.make(config)
    alone = [env.reset(seed)[0], *(env.step(move)[0] for move in moves)]
    a, b = entry.make(config), entry.make(config)
    interleaved = [a.reset(seed)[0]]
    b.reset(99)
    for move in moves:
        b.step(move)
        interleaved.append(a.step(move)[0])
    return alone, interleaved
