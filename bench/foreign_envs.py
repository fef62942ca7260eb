"""What the OpenEnv hop costs: FrozenLake steps/s through our gRPC server, through our server adapting an OpenEnv
server (``openenv:<URL>``, the way `fit` trains on a foreign server), and through OpenEnv's own async client (the
way an OpenEnv trainer such as TRL drives an env).

The OpenEnv server is ours (``python -m env_servers openenv frozenlake``), so the env's own cost is the same in
every variant and the differences are the transports. Each variant plays ``--sessions`` sessions in lockstep turns
(every session gets one reply per turn, as in a rollout; random moves, ~10% malformed replies; an episode that
ends is reset with a fresh seed, resets not counted as steps). Variants alternate within every repeat (A, B, C,
A, B, C, ...); the report gives the median steps/s over repeats and the ratios.

Run:  .venv/bin/python bench/foreign_envs.py          (about 2 minutes)
      .venv/bin/python bench/foreign_envs.py --quick  (smoke, about 30 seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from bench.support.results import Run  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.env_client.local import launch_local_server  # noqa: E402

MOVES = [f"<answer>{m}</answer>" for m in ("Left", "Down", "Right", "Up")]


def reply(rng: random.Random) -> str:
    return "no move here" if rng.random() < 0.1 else rng.choice(MOVES)


async def grpc_variant(address: str, env_id: str, sessions: int, turns: int, seed: int) -> float:
    """Steps/s of ``sessions`` lockstep sessions of ``env_id`` through `EnvPool` (our client, our server)."""
    rng = random.Random(seed)
    async with EnvPool([address], call_timeout_s=120) as pool:
        opened = [await pool.open(env_id) for _ in range(sessions)]
        await asyncio.gather(*(s.reset(seed=rng.randrange(2**31)) for s in opened))

        async def one(session) -> None:
            out = await session.step(reply(rng))
            if out.terminated or out.truncated:
                await session.reset(seed=rng.randrange(2**31))

        return await _timed(lambda: asyncio.gather(*(one(s) for s in opened)), sessions, turns)


async def openenv_variant(url: str, sessions: int, turns: int, seed: int) -> float:
    """Steps/s of ``sessions`` lockstep sessions through OpenEnv's async `GenericEnvClient` (one WebSocket each)."""
    rng = random.Random(seed)
    clients = [GenericEnvClient(base_url=url, message_timeout_s=120) for _ in range(sessions)]
    try:
        await asyncio.gather(*(c.connect() for c in clients))
        await asyncio.gather(*(c.reset(seed=rng.randrange(2**31)) for c in clients))

        async def one(client) -> None:
            out = await client.step({"text": reply(rng)})
            if out.done:
                await client.reset(seed=rng.randrange(2**31))

        return await _timed(lambda: asyncio.gather(*(one(c) for c in clients)), sessions, turns)
    finally:
        await asyncio.gather(*(c.disconnect() for c in clients), return_exceptions=True)


async def _timed(turn: Callable[[], Awaitable[object]], sessions: int, turns: int) -> float:
    started = time.perf_counter()
    for _ in range(turns):
        await turn()
    return sessions * turns / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--server-args", default="", help='more arguments for our server, e.g. "--workers 16"')
    args = parser.parse_args()
    if args.quick:
        args.turns, args.repeats = 10, 2
    run = Run("foreign_envs", quick=args.quick)
    openenv = subprocess.Popen(
        [sys.executable, "-m", "env_servers", "openenv", "frozenlake", "--port", "0", "--max-sessions", "256"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO,
    )  # fmt: skip
    url = json.loads(openenv.stdout.readline())["url"]  # type: ignore[union-attr]
    adapted = f"openenv:{url}"
    ours = launch_local_server(
        ["frozenlake", adapted], extra_args=["--max-sessions", "1024", *args.server_args.split()]
    )
    variants = {
        "ours (gRPC, frozenlake)": lambda k: grpc_variant(ours.address, "frozenlake", args.sessions, args.turns, k),
        "ours adapting OpenEnv (gRPC -> WebSocket)": lambda k: grpc_variant(
            ours.address, adapted, args.sessions, args.turns, k
        ),
        "OpenEnv's client (WebSocket)": lambda k: openenv_variant(url, args.sessions, args.turns, k),
    }
    rates: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for k in range(args.repeats):
            for name, variant in variants.items():
                rates[name].append(asyncio.run(variant(k)))
    finally:
        ours.stop()
        openenv.terminate()
        openenv.wait(10)
    base = statistics.median(rates["ours (gRPC, frozenlake)"])
    print(f"FrozenLake 4x4, {args.sessions} sessions in lockstep, {args.turns} turns x {args.repeats} repeats\n")
    print("| variant | steps/s (median) | min-max | vs ours |\n|---|---|---|---|")
    summary = {}
    for name, values in rates.items():
        median = statistics.median(values)
        summary[name] = {"median_steps_per_s": median, "all": values, "ratio_to_ours": median / base}
        print(f"| {name} | {median:,.0f} | {min(values):,.0f}-{max(values):,.0f} | {median / base:.2f}x |")
    run.write({"summary": summary, "sessions": args.sessions, "turns": args.turns, "repeats": args.repeats})
    print("\n" + run.footer())


if __name__ == "__main__":
    main()
