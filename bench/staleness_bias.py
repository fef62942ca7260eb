"""Which episodes does an async trainer train on? The turns and success of the episodes trained on beside all
the episodes played, under ``max_staleness`` 0, 1 and 2, with and without ``group_redundancy``, and with
``staleness: admit`` (batches take the oldest started groups) beside the default ``drop``.

Dropping a group that went stale, and keeping the first ``group_size`` members of a group to finish, both favour
episodes that end sooner. This measures how much, before anything is built against it. A training loop without
a model: each step takes a batch from the `RolloutScheduler`, "trains" for ``--train-s`` seconds (a sleep),
then does what a publish does (suspend, load a new policy version, resume), with generation going on during
the update (``colocate: false``). The engine is `SimulatedEngine`: random FrozenLake replies, each taking a
time drawn from ``--reply-s``, so an episode's length depends on its replies, as with a real policy. All
variants run at once in one event loop, on one in-process FrozenLake server.

Played episodes are the members that finished in a group that was trained or dropped as stale (groups still
running when the variant stops are left out). The members that redundancy cancels when their group completes
never finish, so they are counted apart, and redundancy's bias shows against the same staleness without it.
Per variant the report gives the episodes' mean turns and success rate, trained vs played, and two-sample
Kolmogorov-Smirnov distances between turn distributions with their asymptotic p-values.

Run:  .venv/bin/python bench/staleness_bias.py               (8 variants x 40 steps, about 2 minutes)
      .venv/bin/python bench/staleness_bias.py --steps 10    (a quick look)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.models import bench_tiny_model  # noqa: E402
from bench.support.results import Run  # noqa: E402
from env_servers.server import EnvServer, ServerConfig  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.rollout.config.rollout import RolloutConfig  # noqa: E402
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine  # noqa: E402
from roll_lightning.rollout.episodes.episode import EpisodeSettings  # noqa: E402
from roll_lightning.rollout.groups.queue import GroupQueue  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

REPLIES = ("<answer>Left</answer>", "<answer>Up</answer>", "<answer>Down</answer>", "<answer>Right</answer>")
VARIANTS = [
    *((mode, staleness, redundancy) for redundancy in (0, 2) for staleness in (0, 1, 2) for mode in ("drop",)),
    *(("admit", staleness, 0) for staleness in (1, 2)),
]


class Recording(GroupQueue):
    """A `GroupQueue` that also notes every finished episode and every group it releases (the bench's probe)."""

    def __init__(self, max_staleness: int, in_start_order: bool) -> None:
        super().__init__(max_staleness, in_start_order)
        self.finished: list[tuple[int, int, float]] = []  # (group index, turns, success)
        self.released: set[int] = set()
        self.dropped: set[int] = set()

    def put(self, index: int, episode: Any) -> bool:
        self.finished.append((index, len(episode.turns), episode.metrics()["success"]))
        return super().put(index, episode)

    def drop(self, index: int, reason: str) -> Any:
        group = super().drop(index, reason)
        if group is not None:
            self.dropped.add(index)
        return group

    async def take(self, n_groups: int) -> list[Any]:
        groups = await super().take(n_groups)
        self.released.update(g.index for g in groups)
        return groups


async def variant(
    pool: EnvPool, tokenizer: Any, args: argparse.Namespace, mode: str, staleness: int, redundancy: int
) -> dict:
    rng = random.Random(args.seed)
    low, high = args.reply_s
    engine = SimulatedEngine(tokenizer, REPLIES, latency_s=lambda: rng.uniform(low, high), seed=args.seed)
    config = RolloutConfig(
        env_id="frozenlake", env_config={"size": 6}, group_size=args.group_size,
        batch_size=args.group_size * args.groups, group_redundancy=redundancy,
        concurrent_episodes=(args.group_size + redundancy) * args.groups * (staleness + 1),
        max_staleness=staleness, staleness=mode, seed=args.seed,
        episode=EpisodeSettings(
            max_turns=args.turns, max_context_tokens=4096, sampling=SamplingParams(max_new_tokens=8)
        ),
    )  # fmt: skip
    scheduler = RolloutScheduler(pool, engine, tokenizer, config)
    queues = [Recording(staleness, mode == "admit") for _ in scheduler.lanes]
    for lane, queue in zip(scheduler.lanes, queues, strict=True):
        lane.queue = queue
    step_s: list[float] = []
    try:
        for step in range(args.steps):
            started = time.perf_counter()
            await scheduler.get_batch()
            await asyncio.sleep(args.train_s)  # the update, generation going on
            await scheduler.suspend()
            await engine.load_weights({}, version=step + 1)
            await scheduler.resume()
            step_s.append(time.perf_counter() - started)
    finally:
        await scheduler.close()
    finished = [e for q in queues for e in q.finished]
    released = set().union(*(q.released for q in queues))
    ended = released | set().union(*(q.dropped for q in queues))  # groups still running at the end left out
    trained = [(turns, success) for index, turns, success in finished if index in released]
    played = [(turns, success) for index, turns, success in finished if index in ended]
    d, p = ks([t for t, _ in trained], [t for t, _ in played])
    return {
        "staleness": mode,
        "step_s_median": statistics.median(step_s[2:]),
        "max_staleness": staleness,
        "group_redundancy": redundancy,
        "trained": len(trained),
        "played": len(played),
        "cancelled": scheduler.counters["redundant_cancelled"],
        "dropped_stale_groups": scheduler.counter("dropped_stale"),
        "turns_trained": statistics.fmean(t for t, _ in trained),
        "turns_played": statistics.fmean(t for t, _ in played),
        "success_trained": statistics.fmean(s for _, s in trained),
        "success_played": statistics.fmean(s for _, s in played),
        "ks_distance": d,
        "ks_p": p,
        "trained_turns": [t for t, _ in trained],
    }


def ks(a: list[int], b: list[int]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov distance and its asymptotic p-value (Smirnov's series)."""
    values = sorted(set(a) | set(b))
    d = max(abs(sum(x <= v for x in a) / len(a) - sum(x <= v for x in b) / len(b)) for v in values)
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    p = 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101)) if lam > 0 else 1.0
    return d, min(1.0, max(0.0, p))


async def main_async(args: argparse.Namespace) -> list[dict]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bench_tiny_model())
    server = EnvServer.run_in_thread(ServerConfig(env_ids=("frozenlake",), port=0, workers=8))
    try:
        async with EnvPool([server.address], health_interval_s=1.0) as pool:
            return list(await asyncio.gather(*(variant(pool, tokenizer, args, *v) for v in VARIANTS)))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--train-s", type=float, default=0.5)
    parser.add_argument("--reply-s", type=float, nargs=2, default=(0.05, 0.15))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    run = Run("staleness_bias")
    rows = asyncio.run(main_async(args))
    header = [
        "staleness", "max_staleness", "redundancy", "step s (median)", "trained / played (cancelled)",
        "stale groups dropped", "turns trained / played", "success trained / played", "KS trained vs played (p)",
        "KS vs drop at the same staleness without redundancy (p)",
    ]  # fmt: skip
    print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    unselected = {
        r["max_staleness"]: r["trained_turns"] for r in rows if r["group_redundancy"] == 0 and r["staleness"] == "drop"
    }
    for r in rows:
        r["ks_vs_no_redundancy"] = ks(r["trained_turns"], unselected[r["max_staleness"]])
        cells = [
            r["staleness"], r["max_staleness"], r["group_redundancy"], f"{r['step_s_median']:.2f}",
            f"{r['trained']} / {r['played']} ({r['cancelled']})", f"{r['dropped_stale_groups']:.0f}",
            f"{r['turns_trained']:.2f} / {r['turns_played']:.2f}",
            f"{r['success_trained']:.1%} / {r['success_played']:.1%}", f"{r['ks_distance']:.3f} ({r['ks_p']:.2g})",
            f"{r['ks_vs_no_redundancy'][0]:.3f} ({r['ks_vs_no_redundancy'][1]:.2g})",
        ]  # fmt: skip
        print("| " + " | ".join(map(str, cells)) + " |")
    run.write({"variants": rows, "args": {k: str(v) for k, v in vars(args).items()}})
    print("\n" + run.footer())


if __name__ == "__main__":
    main()
