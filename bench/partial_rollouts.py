"""Partial rollouts at sync time (issue 18): ``data.rollout.on_suspend: wait`` vs ``abort``, side by side.

A training loop without a model: each step takes a batch from the `RolloutScheduler`, "trains" for ``--train-s``
seconds (a sleep), then does what a publish does: suspend, load weights (a new policy version), resume. In the
``colocated`` scenario it also suspends right after the rollout, as pause does before the engine sleeps;
``disaggregated`` generation goes on during the update. The engine is `SimulatedEngine` (a scheduling stand-in,
no model; any number of replies in flight take the same time) with long replies, in two profiles:

- ``uniform``: every reply takes 1-2 s (uniform), far longer than the 0.2 s update;
- ``long-tail``: replies take 0.05-0.15 s, but 3% of them take 2-3 s.

``wait`` lets the replies in flight finish before the weights change; ``abort`` cancels them and asks those turns
again after the resume. The two variants run at the same time in one event loop (each with its own engine and
scheduler, on the same in-process env server), so whatever else runs on the machine falls on both alike.

Reported per variant: step time (median and mean over the steps after ``--warmup``; the mean is what the
throughput sees), the suspends' time per step (median), the wait for a batch (median), turns aborted per step,
redone turns per batch, staleness, groups dropped as too stale, and the ratios wait / abort (> 1: abort faster).

Run:  .venv/bin/python bench/partial_rollouts.py                 (2 profiles x 2 scenarios, 14 steps each, ~4 min)
      .venv/bin/python bench/partial_rollouts.py --steps 6       (a quick look)
Writes bench/results/partial-rollouts-<utc time>.json and a markdown section (printed, and written to --markdown).
"""

from __future__ import annotations

import argparse
import asyncio
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
from bench.support.results import Run, footer  # noqa: E402
from env_servers.server import EnvServer, ServerConfig  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.rollout.config.rollout import RolloutConfig  # noqa: E402
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine  # noqa: E402
from roll_lightning.rollout.episodes.episode import EpisodeSettings  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

REPLIES = ("<answer>Left</answer>", "<answer>Up</answer>", "<answer>Down</answer>", "<answer>Right</answer>")
# (name, colocate, max_staleness): disaggregated generation runs during training, bounded by the staleness;
# colocated generation is suspended for the whole update (pause) and runs one batch ahead.
SCENARIOS = {
    "disaggregated": (False, 2),
    "colocated": (True, 1),
}


# reply time profiles: (low, high) seconds, uniform; and (share, low, high) of a long tail, or None
PROFILES: dict[str, tuple[tuple[float, float], tuple[float, float, float] | None]] = {
    "uniform": ((1.0, 2.0), None),
    "long-tail": ((0.05, 0.15), (0.03, 2.0, 3.0)),
}


def long_replies(
    tokenizer: Any, low: float, high: float, seed: int, tail: tuple[float, float, float] | None = None
) -> SimulatedEngine:
    """`SimulatedEngine` whose every reply takes a time drawn uniformly from [low, high] seconds; with
    ``tail`` = (p, low, high), a share p of the replies takes a time from that range instead (a long tail)."""

    rng = random.Random(seed)  # the reply times' own draws (the reply texts keep the engine's)

    def draw() -> float:
        if tail is not None and rng.random() < tail[0]:
            return rng.uniform(*tail[1:])
        return rng.uniform(low, high)

    return SimulatedEngine(tokenizer, REPLIES, latency_s=draw, seed=seed)


async def train_loop(
    pool: EnvPool,
    tokenizer: Any,
    args: argparse.Namespace,
    on_suspend: str,
    profile: str,
    colocate: bool,
    staleness: int,
) -> dict[str, Any]:
    bounds, tail = PROFILES[profile]
    engine = long_replies(tokenizer, *bounds, seed=args.seed, tail=tail)
    config = RolloutConfig(
        env_id="sokoban",
        env_config={"dim_room": [6, 6], "num_boxes": 1},
        group_size=args.group_size,
        batch_size=args.group_size * args.groups,
        concurrent_episodes=args.group_size * args.groups * (staleness + 1),
        max_staleness=staleness,
        on_suspend=on_suspend,  # type: ignore[arg-type]
        seed=args.seed,
        episode=EpisodeSettings(
            max_turns=args.turns, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)
        ),
    )
    scheduler = RolloutScheduler(pool, engine, tokenizer, config)
    steps: list[dict[str, float]] = []
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            batch = await scheduler.get_batch()
            t1 = time.perf_counter()
            aborted_before = scheduler.counters["turns_aborted"]
            if colocate:  # pause: generation stops while the policy trains
                await scheduler.suspend()
            t2 = time.perf_counter()
            await asyncio.sleep(args.train_s)  # the update
            t3 = time.perf_counter()
            await scheduler.suspend()  # publish: no reply from half-loaded weights
            t4 = time.perf_counter()
            await engine.load_weights({}, version=step + 1)
            await scheduler.resume()
            t5 = time.perf_counter()
            steps.append(
                {
                    "step_s": t5 - t0,
                    "rollout_s": t1 - t0,
                    "handoff_s": t2 - t1,
                    "sync_suspend_s": t4 - t3,
                    "suspend_s": (t2 - t1) + (t4 - t3),
                    "sync_s": t5 - t3,
                    "turns_aborted": scheduler.counters["turns_aborted"] - aborted_before,
                    "turns_redone": batch.metrics["rollout/turns_redone"],
                    "staleness_mean": batch.metrics["rollout/staleness_mean"],
                    "episodes": batch.metrics["rollout/episodes"],
                    "dropped_stale_total": batch.metrics["rollout/dropped_groups_stale_total"],
                }
            )
    finally:
        await scheduler.close()
    kept = steps[args.warmup :]

    def median(key: str) -> float:
        return statistics.median(s[key] for s in kept)

    def mean(key: str) -> float:
        return statistics.fmean(s[key] for s in kept)

    return {
        "on_suspend": on_suspend,
        "step_s_median": median("step_s"),
        "step_s_mean": mean("step_s"),
        "suspend_s_mean": mean("suspend_s"),
        "suspend_s_median": median("suspend_s"),
        "rollout_s_median": median("rollout_s"),
        "turns_aborted_per_step": mean("turns_aborted"),
        "turns_redone_per_batch": mean("turns_redone"),
        "staleness_mean": mean("staleness_mean"),
        "engine_requests": engine.stats()["requests"],
        "dropped_groups_stale": scheduler.counter("dropped_stale"),
        "steps": steps,
    }


async def run(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    server = EnvServer.run_in_thread(ServerConfig(env_ids=("sokoban",), port=0))
    out: dict[str, Any] = {}
    try:
        async with EnvPool([server.address], health_interval_s=1.0) as pool:
            for profile in args.profiles:
                for name in args.scenarios:
                    colocate, staleness = SCENARIOS[name]
                    print(f"== {profile} replies, {name} (max_staleness {staleness}): wait and abort side by side ==")
                    wait, abort = await asyncio.gather(
                        *(
                            train_loop(pool, tokenizer, args, mode, profile, colocate, staleness)
                            for mode in ("wait", "abort")
                        )
                    )
                    out[f"{profile}/{name}"] = {
                        "profile": profile,
                        "scenario": name,
                        "colocate": colocate,
                        "max_staleness": staleness,
                        "wait": wait,
                        "abort": abort,
                        "ratio_step_median_wait_over_abort": wait["step_s_median"] / abort["step_s_median"],
                        "ratio_step_mean_wait_over_abort": wait["step_s_mean"] / abort["step_s_mean"],
                    }
    finally:
        server.stop()
    return out


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "## Partial rollouts at sync time: `on_suspend: wait` vs `abort` (issue 18)",
        "",
        f"`{res['command']}` ({res['wall_s'] / 60:.1f} min): a model-free training loop (a batch, a "
        f"{a['train_s']} s update, then suspend, load, resume as a publish does) with `SimulatedEngine`, "
        f"Sokoban 6x6 episodes of {a['turns']} turns, {a['groups']} groups of {a['group_size']} per batch; "
        f"{a['steps']} steps per variant, the first {a['warmup']} not counted; `wait` and `abort` run at the same "
        "time in one process. Reply times: `uniform` 1-2 s each; `long-tail` 0.05-0.15 s, 3% of them 2-3 s. "
        "Disaggregated (`data.colocate: false`, max_staleness 2): generation goes on during the update; colocated "
        "(max_staleness 1): it is also suspended for the update (pause). Step time = batch wait + update + "
        "suspends + load; the mean is what throughput sees (the steps alternate between short and long ones, so "
        "the median alone can mislead).",
        "",
        "| replies | scenario | on_suspend | step s median | step s mean | suspend s / step (median) "
        "| batch wait s (median) | turns aborted / step | redone / batch | staleness | groups dropped stale "
        "| wait / abort: median, mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc in res["scenarios"].values():
        for mode in ("wait", "abort"):
            r = sc[mode]
            ratio = ""
            if mode == "abort":
                ratio = (
                    f"**{sc['ratio_step_median_wait_over_abort']:.2f}x**, "
                    f"**{sc['ratio_step_mean_wait_over_abort']:.2f}x**"
                )
            lines.append(
                f"| {sc['profile']} | {sc['scenario']} | `{mode}` | {r['step_s_median']:.2f} | {r['step_s_mean']:.2f} "
                f"| {r['suspend_s_median']:.3f} | {r['rollout_s_median']:.2f} | {r['turns_aborted_per_step']:.1f} "
                f"| {r['turns_redone_per_batch']:.1f} | {r['staleness_mean']:.2f} | {r['dropped_groups_stale']:.0f} "
                f"| {ratio} |"
            )
    lines += ["", f"{footer(res)}. Machine: {res['machine']['cpus']} CPUs (shared VM). JSON: `{res['json']}`."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=14, help="training steps per variant")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the statistics")
    ap.add_argument("--train-s", type=float, default=0.2, help="the update's duration (a sleep)")
    ap.add_argument("--turns", type=int, default=3, help="turns per episode (Sokoban rarely ends sooner)")
    ap.add_argument("--groups", type=int, default=4, help="groups per batch")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES))
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--markdown", type=Path, default=Path("/tmp/partial_rollouts_section.md"))
    args = ap.parse_args()
    if args.warmup >= args.steps:
        ap.error("--warmup must be smaller than --steps")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bench_tiny_model())
    bench_run = Run("partial-rollouts")
    scenarios = asyncio.run(run(args, tokenizer))
    res = {
        "args": {k: v for k, v in vars(args).items() if k != "markdown"},
        "json": str(bench_run.path.relative_to(REPO)),
        "scenarios": scenarios,
    }
    path = bench_run.write(res)
    text = markdown(res)
    args.markdown.write_text(text)
    print(text)
    print(f"wrote {path} and {args.markdown}")


if __name__ == "__main__":
    main()
