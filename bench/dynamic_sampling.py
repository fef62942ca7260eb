"""Dynamic sampling benchmark (issue 12): does a group filter make the CPU recipe learn FrozenLake sooner?

Runs ``configs/frozenlake_learn.yaml`` (GRPO) once per filter, with the same seeds, each for ``--minutes`` of
training: no filter, ``zero_variance`` (drop groups whose members all scored the same, refill up to one batch of
extra groups) and ``top_p_variance`` (play twice the groups, keep the half with the largest spread). The variants
run **at the same time** (``--parallel``, the default), so the machine's noise (other jobs, thermal state) falls
on all of them alike and the ratios between them are fair; each gets a share of the cores, so their absolute
times are slower than a run alone. ``--sequential`` runs them one after the other instead.

Reported per variant: held-out success before the first update and after the budget, wall-clock minutes until
held-out success first reached +30 points over step 0, rollout steps, median step time, the share of trained rows
whose advantage was 0 (``train/zero_advantage_share``, mean over steps), groups filtered and extra groups played
per batch, and the share of updates skipped for having no signal at all.

Run:  .venv/bin/python bench/dynamic_sampling.py                  (3 variants x 15 minutes, side by side)
      .venv/bin/python bench/dynamic_sampling.py --minutes 3      (a quick look)
Writes bench/results/dynamic-sampling-<utc time>/{<variant>/..., summary.json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]  # learning_curve; bench.support
from learning_curve import fit_command, read_metrics, start, summarise  # noqa: E402

from bench.support.results import Run, footer  # noqa: E402

ZERO_VARIANCE = ["--data.rollout.group_filter.kind", "zero_variance"]
TOP_P = ["--data.rollout.group_filter.kind", "top_p_variance", "--data.rollout.group_filter.top_p"]
VARIANTS = {
    "none": ["--data.rollout.group_filter.kind", "none"],
    "zero_variance": ZERO_VARIANCE,  # up to one batch of extra groups (the default bound)
    "zero_variance_x4": [*ZERO_VARIANCE, "--data.rollout.group_filter.max_extra_groups", "24"],  # up to 3 batches
    "top_p_variance": [*TOP_P, "0.5"],
    "top_p_0.25": [*TOP_P, "0.25"],
}
DEFAULT_VARIANTS = ["none", "zero_variance", "top_p_variance"]


def first_gain(evals: list[dict[str, Any]], points: float) -> dict[str, Any] | None:
    """The first evaluation whose held-out success is at least step 0's + ``points`` (its step and minutes)."""
    first = evals[0]["success"]
    return next((e for e in evals[1:] if e["success"] - first >= points / 100), None)


def mean_of(series: dict[str, list[tuple[int, float]]], key: str) -> float | None:
    values = [v for _, v in series.get(key, [])]
    return statistics.fmean(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="training budget per variant")
    ap.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    ap.add_argument("--eval-every", type=int, default=25, help="rollout steps between evaluations")
    ap.add_argument("--sequential", action="store_true", help="one variant after the other (default: together)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", type=Path, metavar="DIR", help="print the table of an earlier run's summary.json")
    args = ap.parse_args()
    if args.report:
        summary = json.loads((args.report / "summary.json").read_text())
        for res in summary["results"]:  # runs written before steps_to_plus_30 was recorded
            res.setdefault("steps_to_plus_30", (gain := first_gain(res["evals"], 30)) and gain["step"] + 1)
        return print_table(summary, args.report)
    bench_run = Run("dynamic-sampling")
    out = bench_run.directory(args.out)
    config = BENCH.parent / "configs" / "frozenlake_learn.yaml"
    commands = {v: fit_command(config, v, args.minutes, args.eval_every, out, VARIANTS[v]) for v in args.variants}
    walls: dict[str, float] = {}
    running = {}
    for variant, cmd in commands.items():
        started = time.perf_counter()
        running[variant] = (start(cmd, out / f"{variant}.log", threads=1), started)
        if args.sequential:
            running[variant][0].wait()
            walls[variant] = time.perf_counter() - started
    for variant, (proc, started) in running.items():
        if proc.wait():
            raise SystemExit(f"{variant}: the run failed; see {out / f'{variant}.log'}")
        walls.setdefault(variant, time.perf_counter() - started)
    results = []
    for variant, cmd in commands.items():
        res = summarise(variant, cmd, out / variant, walls[variant])
        series = read_metrics(out / variant)
        res.update(
            variant=variant,
            minutes_to_plus_30=(gain := first_gain(res["evals"], 30)) and gain["minutes"],
            steps_to_plus_30=gain and gain["step"],  # logged at the rollout step, counted from 1
            zero_advantage_share=mean_of(series, "train/zero_advantage_share"),
            groups_filtered_per_batch=mean_of(series, "rollout/groups_filtered"),
            extra_groups_per_batch=mean_of(series, "rollout/extra_groups"),
            updates_skipped=mean_of(series, "train/update_skipped"),
        )
        results.append(res)
    summary = {"minutes": args.minutes, "parallel": not args.sequential, "results": results}
    bench_run.write(summary, out / "summary.json")
    print_table(summary, out)


def print_table(summary: dict[str, Any], out: Path) -> None:
    print(
        "| filter | eval step 0 | eval at end | min to +30 pts | steps to +30 pts | steps | step s (median) "
        "| zero-adv rows | filtered / batch | extra / batch | skipped |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.0%}"

    for res in summary["results"]:
        evals, to30, steps30 = res["evals"], res["minutes_to_plus_30"], res.get("steps_to_plus_30")
        print(
            f"| {res['variant']} | {evals[0]['success']:.1%} | {evals[-1]['success']:.1%} (step {evals[-1]['step']}) "
            f"| {'not reached' if to30 is None else f'{to30:.1f}'} | {steps30 or '-'} | {res['rollout_steps']} | "
            f"{res['step_s_median']:.2f} | {pct(res['zero_advantage_share'])} | "
            f"{res['groups_filtered_per_batch'] or 0:.2f} | {res['extra_groups_per_batch'] or 0:.2f} | "
            f"{pct(res['updates_skipped'])} |"
        )
    print(footer(summary))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
