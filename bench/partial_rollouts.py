"""Partial rollouts at sync time (issues 18, 51): ``data.rollout.on_suspend: wait`` vs ``abort`` vs ``keep``.

A training loop: each step takes a batch from the `RolloutScheduler`, "trains" for ``--train-s`` seconds (a
sleep), then does what a publish does: suspend, load weights (a new policy version), resume. In the ``colocated``
scenario it also suspends right after the rollout, as pause does before the engine sleeps; ``disaggregated``
generation goes on during the update.

``wait`` lets the replies in flight finish before the weights change; ``abort`` cancels them and asks those turns
again after the resume; ``keep`` stops each where it is (``engine.interrupt()``) and, after the load, continues it
from prompt + the tokens it kept, under the new weights.

``--engine simulated`` (default): `SimulatedEngine` (a scheduling stand-in, no model; any number of replies in
flight take the same time; an interrupted reply keeps the share of its tokens its elapsed time covers, and its
continuation takes the rest of its time), with long replies in two profiles:

- ``uniform``: every reply takes 1-2 s (uniform), far longer than the 0.2 s update;
- ``long-tail``: replies take 0.05-0.15 s, but 3% of them take 2-3 s.

The three variants run at the same time in one event loop (each with its own engine and scheduler, on the same
in-process env server), so whatever else runs on the machine falls on all alike.

``--engine transformers``: `TransformersEngine` on a tiny random Qwen2 (``--hidden-size``, 2 layers; one torch
thread) with long replies: ``--max-new-tokens`` (128) sampled tokens, eos suppressed, so every reply runs to its
length and generation time dominates. Each load is a real one: the state dict of a second tiny model (seed 1) and
of the first (seed 0), alternating, so a kept reply really continues under other weights. Three engines cannot
share two CPUs fairly, so the variants run one after another, interleaved: ``--rounds`` rounds of wait, abort,
keep, each a fresh engine and scheduler for ``--steps`` steps; the statistics pool the rounds' counted steps.

Reported per variant: step time (median and mean over the steps after ``--warmup``; the mean is what the
throughput sees), the suspends' time per step (median), the wait for a batch (median), turns aborted per step,
turns kept per step (``keep``: replies a suspend stopped and the new weights continued), redone turns and
``rollout/turns_across_versions`` per batch, staleness, groups dropped as too stale; and the ratios wait / keep and
abort / keep (step time of the other variant over keep's: > 1 means keep is faster), and wait / abort.

Run:  .venv/bin/python bench/partial_rollouts.py                  (2 profiles x 2 scenarios, 14 steps each, ~3 min)
      .venv/bin/python bench/partial_rollouts.py --steps 6        (a quick look)
      .venv/bin/python bench/partial_rollouts.py --engine transformers   (2 scenarios x 3 rounds x 3 variants)
Writes bench/results/partial-rollouts[-transformers]-<utc time>.json and a markdown section (printed, and written
to --markdown); ``--from-json PATH`` prints a run's section again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.models import MODEL_CACHE, bench_tiny_model  # noqa: E402
from bench.support.results import Run, footer  # noqa: E402
from env_servers.server import EnvServer, ServerConfig  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.models.tiny import tiny_model  # noqa: E402
from roll_lightning.rollout.config.rollout import RolloutConfig  # noqa: E402
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine  # noqa: E402
from roll_lightning.rollout.episodes.episode import EpisodeSettings  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

MODES = ("wait", "abort", "keep")
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


Load = Callable[[Any, int], Awaitable[None]]  # (engine, step) -> a weight load to version step + 1


async def train_loop(
    pool: EnvPool,
    tokenizer: Any,
    args: argparse.Namespace,
    on_suspend: str,
    engine: Any,
    load: Load,
    sampling: SamplingParams,
    colocate: bool,
    staleness: int,
) -> list[dict[str, float]]:
    """``args.steps`` training steps with this engine; one record per step."""
    config = RolloutConfig(
        env_id="sokoban",
        env_config={"dim_room": [6, 6], "num_boxes": 1},
        group_size=args.group_size,
        batch_size=args.group_size * args.groups,
        concurrent_episodes=args.group_size * args.groups * (staleness + 1),
        max_staleness=staleness,
        on_suspend=on_suspend,  # type: ignore[arg-type]
        seed=args.seed,
        episode=EpisodeSettings(max_turns=args.turns, max_context_tokens=4096, sampling=sampling),
    )
    scheduler = RolloutScheduler(pool, engine, tokenizer, config)
    steps: list[dict[str, float]] = []
    try:
        for step in range(args.steps):
            t0 = time.perf_counter()
            calls_before = getattr(engine, "_batches", 0)  # TransformersEngine: model.generate calls
            tokens_before = engine.stats()["generated_tokens"]
            batch = await scheduler.get_batch()
            t1 = time.perf_counter()
            aborted_before = scheduler.counters["turns_aborted"]
            kept_before = scheduler.counters["turns_kept"]
            if colocate:  # pause: generation stops while the policy trains
                await scheduler.suspend()
            t2 = time.perf_counter()
            await asyncio.sleep(args.train_s)  # the update
            t3 = time.perf_counter()
            await scheduler.suspend()  # publish: no reply from half-loaded weights
            t4 = time.perf_counter()
            await load(engine, step)
            t5 = time.perf_counter()
            await scheduler.resume()
            t6 = time.perf_counter()
            steps.append(
                {
                    "step_s": t6 - t0,
                    "rollout_s": t1 - t0,
                    "handoff_s": t2 - t1,
                    "sync_suspend_s": t4 - t3,
                    "suspend_s": (t2 - t1) + (t4 - t3),
                    "load_s": t5 - t4,
                    "sync_s": t6 - t3,
                    "turns_aborted": scheduler.counters["turns_aborted"] - aborted_before,
                    "turns_kept": scheduler.counters["turns_kept"] - kept_before,
                    "turns_redone": batch.metrics["rollout/turns_redone"],
                    "turns_across_versions": batch.metrics.get("rollout/turns_across_versions", 0.0),
                    "staleness_mean": batch.metrics["rollout/staleness_mean"],
                    "episodes": batch.metrics["rollout/episodes"],
                    "dropped_stale_total": batch.metrics["rollout/dropped_groups_stale_total"],
                    "dropped_stale": float(scheduler.counter("dropped_stale")),
                    "generate_calls": float(getattr(engine, "_batches", 0) - calls_before),
                    "generated_tokens": engine.stats()["generated_tokens"] - tokens_before,
                }
            )
    finally:
        await scheduler.close()
    return steps


def summary(mode: str, counted: list[dict[str, float]], dropped_stale: float, requests: float) -> dict[str, Any]:
    """A variant's statistics over its counted steps (pooled over rounds)."""

    def median(key: str) -> float:
        return statistics.median(s[key] for s in counted)

    def mean(key: str) -> float:
        return statistics.fmean(s[key] for s in counted)

    return {
        "on_suspend": mode,
        "steps_counted": len(counted),
        "step_s_median": median("step_s"),
        "step_s_mean": mean("step_s"),
        "suspend_s_mean": mean("suspend_s"),
        "suspend_s_median": median("suspend_s"),
        "load_s_median": median("load_s"),
        "rollout_s_median": median("rollout_s"),
        "turns_aborted_per_step": mean("turns_aborted"),
        "turns_kept_per_step": mean("turns_kept"),
        "turns_redone_per_batch": mean("turns_redone"),
        "turns_across_versions_per_batch": mean("turns_across_versions"),
        "staleness_mean": mean("staleness_mean"),
        "generate_calls_per_step": mean("generate_calls"),
        "generated_tokens_per_step": mean("generated_tokens"),
        "engine_requests": requests,
        "dropped_groups_stale": dropped_stale,
    }


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Step-time ratios, the other variant over keep (> 1: keep faster), and wait over abort (> 1: abort faster)."""
    out = {}
    for a, b in (("wait", "keep"), ("abort", "keep"), ("wait", "abort")):
        for stat in ("median", "mean"):
            out[f"{a}_over_{b}_{stat}"] = variants[a][f"step_s_{stat}"] / variants[b][f"step_s_{stat}"]
    return out


async def simulated_loop(
    pool: EnvPool, tokenizer: Any, args: argparse.Namespace, mode: str, profile: str, colocate: bool, staleness: int
) -> dict[str, Any]:
    bounds, tail = PROFILES[profile]
    engine = long_replies(tokenizer, *bounds, seed=args.seed, tail=tail)

    async def load(engine: Any, step: int) -> None:
        await engine.load_weights({}, version=step + 1)

    sampling = SamplingParams(max_new_tokens=16)
    steps = await train_loop(pool, tokenizer, args, mode, engine, load, sampling, colocate, staleness)
    out = summary(mode, steps[args.warmup :], steps[-1]["dropped_stale"], engine.stats()["requests"])
    return {**out, "steps": steps}


async def run_simulated(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    server = EnvServer.run_in_thread(ServerConfig(env_ids=("sokoban",), port=0))
    out: dict[str, Any] = {}
    try:
        async with EnvPool([server.address], health_interval_s=1.0) as pool:
            for profile in args.profiles:
                for name in args.scenarios:
                    colocate, staleness = SCENARIOS[name]
                    print(f"== {profile} replies, {name} (max_staleness {staleness}): {', '.join(MODES)} side by side")
                    results = await asyncio.gather(
                        *(simulated_loop(pool, tokenizer, args, m, profile, colocate, staleness) for m in MODES)
                    )
                    variants = dict(zip(MODES, results, strict=True))
                    out[f"{profile}/{name}"] = {
                        "profile": profile,
                        "scenario": name,
                        "colocate": colocate,
                        "max_staleness": staleness,
                        **variants,
                        "ratios": ratios(variants),
                    }
                    print("   " + ", ".join(f"{m} {variants[m]['step_s_mean']:.2f} s" for m in MODES))
    finally:
        server.stop()
    return out


async def run_transformers(args: argparse.Namespace, tokenizer: Any, models: list[Path]) -> dict[str, Any]:
    """The three variants one after another, ``args.rounds`` rounds of wait, abort, keep, each a fresh engine."""
    import torch

    from roll_lightning.models.resolve import load_policy
    from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

    torch.set_num_threads(args.threads)
    # the loads alternate: seed 1's weights, then seed 0's (the engine starts on seed 0's)
    states = [{k: v.detach().clone() for k, v in load_policy(m).state_dict().items()} for m in reversed(models)]

    async def load(engine: Any, step: int) -> None:
        await engine.load_weights(states[step % 2], version=step + 1)

    sampling = SamplingParams(max_new_tokens=args.max_new_tokens)
    server = EnvServer.run_in_thread(ServerConfig(env_ids=("sokoban",), port=0))
    out: dict[str, Any] = {}
    try:
        async with EnvPool([server.address], health_interval_s=1.0) as pool:
            for name in args.scenarios:
                colocate, staleness = SCENARIOS[name]
                print(f"== transformers, {name} (max_staleness {staleness}): {args.rounds} rounds of wait, abort, keep")
                steps: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
                dropped = dict.fromkeys(MODES, 0.0)
                requests = dict.fromkeys(MODES, 0.0)
                rounds = []
                for r in range(args.rounds):
                    record: dict[str, Any] = {"load_start": os.getloadavg()}
                    for mode in MODES:
                        engine = TransformersEngine(
                            models[0], max_batch_size=64, seed=args.seed + r, threads=args.threads
                        )
                        engine._suppressed = [*engine._suppressed, *engine.eos_ids]  # replies run to their length
                        try:
                            run = await train_loop(
                                pool, tokenizer, args, mode, engine, load, sampling, colocate, staleness
                            )
                        finally:
                            await engine.close()
                        steps[mode] += run[args.warmup :]
                        dropped[mode] += run[-1]["dropped_stale"]
                        requests[mode] += engine.stats()["requests"]
                        record[mode] = {
                            "step_s_median": statistics.median(s["step_s"] for s in run[args.warmup :]),
                            "steps": run,
                        }
                    record["load_end"] = os.getloadavg()
                    rounds.append(record)
                    print(
                        f"   round {r + 1}: "
                        + ", ".join(f"{m} {record[m]['step_s_median']:.2f} s" for m in MODES)
                        + f" (median step; load {record['load_start'][0]:.2f})"
                    )
                variants = {m: summary(m, steps[m], dropped[m], requests[m]) for m in MODES}
                out[f"transformers/{name}"] = {
                    "profile": f"tiny model, {args.max_new_tokens} tokens",
                    "scenario": name,
                    "colocate": colocate,
                    "max_staleness": staleness,
                    **variants,
                    "ratios": ratios(variants),
                    "round_ratios": [
                        {
                            "wait_over_keep": rd["wait"]["step_s_median"] / rd["keep"]["step_s_median"],
                            "abort_over_keep": rd["abort"]["step_s_median"] / rd["keep"]["step_s_median"],
                        }
                        for rd in rounds
                    ],
                    "rounds": rounds,
                }
    finally:
        server.stop()
    return out


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    if a["engine"] == "simulated":
        intro = (
            f"`SimulatedEngine`, {a['steps']} steps per variant, the first {a['warmup']} not counted; `wait`, "
            "`abort` and `keep` run at the same time in one process. Reply times: `uniform` 1-2 s each; `long-tail` "
            "0.05-0.15 s, 3% of them 2-3 s (a kept reply keeps the share of its tokens its elapsed time covers, its "
            "continuation takes the rest of its time)"
        )
    else:
        intro = (
            f"`TransformersEngine` on a tiny random Qwen2 (hidden {a['hidden_size']}, 2 layers, one torch thread), "
            f"replies of {a['max_new_tokens']} sampled tokens (eos suppressed); each load is a real one, the state "
            "dict of a second tiny model (seed 1) and of the first (seed 0), alternating. The variants run one after "
            f"another: {a['rounds']} rounds of `wait`, `abort`, `keep`, each a fresh engine for {a['steps']} steps, "
            f"the first {a['warmup']} of each not counted; the statistics pool the rounds"
        )
    lines = [
        f"`{res['command']}` ({res['wall_s'] / 60:.1f} min): a training loop without a trainer (a batch, a "
        f"{a['train_s']} s update (a sleep), then suspend, load, resume as a publish does) with {intro}. Sokoban 6x6 "
        f"episodes of {a['turns']} "
        f"turns, {a['groups']} groups of {a['group_size']} per batch. Disaggregated (max_staleness 2): generation "
        "goes on during the update; colocated (max_staleness 1): it is also suspended for the update (pause). "
        "Step time = batch wait + update + suspends + load. Ratios: the other variant's step time over `keep`'s "
        "(> 1: `keep` faster), median and mean.",
        "",
        "| replies | scenario | on_suspend | step s median | step s mean | suspend s / step (median) "
        "| load s (median) | batch wait s (median) | turns aborted / step | turns kept / step | redone / batch "
        "| across versions / batch | staleness | groups dropped stale | wait / keep | abort / keep |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc in res["scenarios"].values():
        q = sc["ratios"]
        for mode in MODES:
            r = sc[mode]
            cells = ["", ""]
            if mode == "keep":
                cells = [
                    f"**{q['wait_over_keep_median']:.2f}x**, **{q['wait_over_keep_mean']:.2f}x**",
                    f"**{q['abort_over_keep_median']:.2f}x**, **{q['abort_over_keep_mean']:.2f}x**",
                ]
            lines.append(
                f"| {sc['profile']} | {sc['scenario']} | `{mode}` | {r['step_s_median']:.2f} | {r['step_s_mean']:.2f} "
                f"| {r['suspend_s_median']:.3f} | {r['load_s_median']:.3f} | {r['rollout_s_median']:.2f} "
                f"| {r['turns_aborted_per_step']:.1f} "
                f"| {r['turns_kept_per_step']:.1f} | {r['turns_redone_per_batch']:.1f} "
                f"| {r['turns_across_versions_per_batch']:.1f} | {r['staleness_mean']:.2f} "
                f"| {r['dropped_groups_stale']:.0f} | {cells[0]} | {cells[1]} |"
            )
    if a["engine"] == "transformers":
        work_title = "Engine work per step (mean): `model.generate` calls, tokens delivered (not a cancelled reply's):"
        lines += ["", work_title, ""]
        for sc in res["scenarios"].values():
            work = "; ".join(
                f"`{m}` {sc[m]['generate_calls_per_step']:.1f} calls, {sc[m]['generated_tokens_per_step']:.0f} tokens"
                for m in MODES
            )
            lines.append(f"- {sc['scenario']}: {work}")
        lines += ["", "Per round, median step time over `keep`'s (wait / keep, abort / keep):", ""]
        for sc in res["scenarios"].values():
            per = "; ".join(f"{x['wait_over_keep']:.2f}x, {x['abort_over_keep']:.2f}x" for x in sc["round_ratios"])
            lines.append(f"- {sc['scenario']}: {per}")
    m = res["machine"]
    lines += [
        "",
        f"{footer(res)}. Machine: {m['cpus']} CPUs, {m['cpu_model']} (shared VM). JSON: `{res['json']}`.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("simulated", "transformers"), default="simulated")
    ap.add_argument("--steps", type=int, default=None, help="training steps per variant (14; transformers: 6 a round)")
    ap.add_argument("--warmup", type=int, default=None, help="first steps left out of the statistics (2; 1 a round)")
    ap.add_argument("--train-s", type=float, default=0.2, help="the update's duration (a sleep)")
    ap.add_argument("--turns", type=int, default=3, help="turns per episode (Sokoban rarely ends sooner)")
    ap.add_argument("--groups", type=int, default=4, help="groups per batch")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=list(PROFILES), help="simulated only")
    ap.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--rounds", type=int, default=3, help="transformers: rounds of wait, abort, keep")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="transformers: tokens per reply")
    ap.add_argument("--hidden-size", type=int, default=64, help="transformers: the tiny model's width")
    ap.add_argument("--threads", type=int, default=1, help="transformers: torch threads")
    ap.add_argument("--markdown", type=Path, default=Path("/tmp/partial_rollouts_section.md"))
    ap.add_argument("--from-json", type=Path, help="print the markdown section of a run's JSON again, run nothing")
    args = ap.parse_args()
    if args.from_json:
        print(markdown(json.loads(args.from_json.read_text())))
        return
    real = args.engine == "transformers"
    args.steps = args.steps if args.steps is not None else (6 if real else 14)
    args.warmup = args.warmup if args.warmup is not None else (1 if real else 2)
    if args.warmup >= args.steps:
        ap.error("--warmup must be smaller than --steps")
    from transformers import AutoTokenizer

    bench_run = Run("partial-rollouts" + ("-transformers" if real else ""))
    if real:
        sizes = {"hidden_size": args.hidden_size} if args.hidden_size != 64 else {}
        models = [bench_tiny_model(**sizes), tiny_model(MODEL_CACHE, seed=1, **sizes)]
        tokenizer = AutoTokenizer.from_pretrained(models[0])
        scenarios = asyncio.run(run_transformers(args, tokenizer, models))
    else:
        tokenizer = AutoTokenizer.from_pretrained(bench_tiny_model())
        scenarios = asyncio.run(run_simulated(args, tokenizer))
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
