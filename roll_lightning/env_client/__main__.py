"""`python -m roll_lightning.env_client play sokoban --episodes 32`: random-agent episodes through the real client.

The quickest end-to-end check of an env deployment. Exit code 0 when every episode finished, 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass

from roll_lightning.env_client import EnvPool, EpisodeFailed
from roll_lightning.env_client.pool import TRANSPORTS

DIRECTIONS = ("Up", "Down", "Left", "Right")


@dataclass
class EpisodeSummary:
    seed: int
    steps: int
    episode_return: float
    success: bool
    invalid: int
    endpoint: str


async def run_episode(pool: EnvPool, env_id: str, config: dict, seed: int, invalid_rate: float) -> EpisodeSummary:
    rng = random.Random(seed)
    session = await pool.open(env_id, config)
    try:
        await session.reset(seed=seed)
        total, invalid, success, steps = 0.0, 0, False, 0
        while True:
            if rng.random() < invalid_rate:
                reply = "I think I should move somewhere."
            else:
                reply = f"Let me try. <answer>{rng.choice(DIRECTIONS)}</answer>"
            out = await session.step(reply)
            steps += 1
            total += out.reward
            invalid += not out.action_valid
            success = success or out.metrics.get("success", 0.0) > 0
            if out.done:
                return EpisodeSummary(seed, steps, total, success, invalid, session.address)
    finally:
        await session.close()


async def play(args: argparse.Namespace) -> int:
    config = json.loads(args.config) if args.config else {}
    endpoints = "local" if args.endpoints == ["local"] else args.endpoints
    pool = EnvPool(endpoints, local_envs=[args.env], local_servers=args.local_servers, transport=args.transport)
    start = time.perf_counter()
    async with pool:
        print(f"env '{args.env}' on {', '.join(ep.address for ep in pool.endpoints)}", flush=True)
        gate = asyncio.Semaphore(args.concurrency)
        results: list[EpisodeSummary] = []
        failures: list[EpisodeFailed] = []

        async def one(seed: int) -> None:
            async with gate:
                try:
                    summary = await run_episode(pool, args.env, config, seed, args.invalid_rate)
                except EpisodeFailed as err:
                    failures.append(err)
                    print(f"seed {seed:>6}: FAILED {err}", flush=True)
                    return
                results.append(summary)
                print(
                    f"seed {seed:>6}: {summary.steps:>3} steps  return {summary.episode_return:+7.2f}  "
                    f"{'solved' if summary.success else 'unsolved'}  invalid {summary.invalid}",
                    flush=True,
                )

        await asyncio.gather(*(one(args.seed + i) for i in range(args.episodes)))
    elapsed = time.perf_counter() - start
    steps = sum(r.steps for r in results)
    if results:
        print(
            f"\n{len(results)} episodes, {steps} steps in {elapsed:.1f}s ({steps / elapsed:.0f} steps/s): "
            f"success {sum(r.success for r in results) / len(results):.0%}, "
            f"mean return {sum(r.episode_return for r in results) / len(results):+.2f}, "
            f"mean length {steps / len(results):.1f}, "
            f"invalid replies {sum(r.invalid for r in results) / max(steps, 1):.0%}"
        )
    if failures:
        print(f"{len(failures)} episodes failed", file=sys.stderr)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m roll_lightning.env_client", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("play", help="play random-agent episodes against an env server")
    p.add_argument("env", help="env id, e.g. sokoban or frozenlake")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=16, help="episodes running at once")
    p.add_argument("--seed", type=int, default=0, help="episode i uses seed SEED+i")
    p.add_argument("--config", help='env config as JSON, e.g. \'{"dim_room": [6, 6], "num_boxes": 1}\'')
    p.add_argument("--endpoints", nargs="+", default=["local"], help="'local' (start servers here) or host:port ...")
    p.add_argument("--local-servers", type=int, default=1)
    p.add_argument("--transport", choices=TRANSPORTS, default="batch")
    p.add_argument("--invalid-rate", type=float, default=0.1, help="share of deliberately malformed replies")
    args = parser.parse_args(argv)
    return asyncio.run(play(args))


if __name__ == "__main__":
    sys.exit(main())
