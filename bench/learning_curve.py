"""Learning benchmark (issues 6, 13): does a CPU recipe learn, GRPO vs GiGPO, in a fixed wall-clock budget?

Each estimator runs ``python -m roll_lightning fit --config <config>`` (the main command's ``configs/sokoban.yaml``
by default, or ``configs/frozenlake_learn.yaml``) as its own process with ``--trainer.max_time`` = the budget:
one after the other (each gets the whole machine), or with ``--parallel`` at the same time, one torch thread
each (the same seeds and the same load for both: a side-by-side comparison on a noisy machine). The recipe evaluates
the untrained policy before the first update (step 0) and then every ``--eval-every`` rollout steps, on the same
held-out map seeds (odd seeds; training plays even ones), through the same evaluation path as ``validate``. The
budget counts from the start of training and includes those evaluations; the process start (model build, env
server launch) is reported separately.

Run:  .venv/bin/python bench/learning_curve.py --plot docs/sokoban_curve.png   (GRPO then GiGPO, 2 x 30 minutes)
      .venv/bin/python bench/learning_curve.py --parallel --plot docs/sokoban_curve.png   (both at once, 30 minutes)
      .venv/bin/python bench/learning_curve.py --estimators --add gigpo=runs/sokoban  (report a run made elsewhere)
      .venv/bin/python bench/learning_curve.py --config configs/frozenlake_learn.yaml --minutes 15 --eval-every 50 \
          --threads 1 --plot docs/learning_curve.png                            (FrozenLake, 2 x 15 minutes)
      .venv/bin/python bench/learning_curve.py --minutes 2                      (a quick look)
Writes bench/results/learning-<utc time>/{<estimator>/..., summary.json} and, with --plot, a PNG of the curves.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402  (dynamic_sampling, multi_env, off_policy take it from here)

CONFIG = REPO / "configs" / "sokoban.yaml"
TITLES = {
    "sokoban": "Sokoban 6x6, 1 box (levels from seeds), tiny-grid model from scratch, 2-core CPU",
    "frozenlake_learn": "FrozenLake 4x4 (random maps from seeds), tiny-words model from scratch, 2-core CPU",
    "frozenlake_pixels": "FrozenLake 4x4 from the board's picture, tiny-vl-words (Qwen2-VL) from scratch, 2-core CPU",
}


def read_metrics(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a run's CSV log as (step, value) pairs, in order."""
    (path,) = run_dir.glob("lightning_logs/version_*/metrics.csv")
    series: dict[str, list[tuple[int, float]]] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in ("", None):
                    series.setdefault(key, []).append((int(row["step"]), float(value)))
    return series


def fit_command(
    config: Path, name: str, minutes: float, eval_every: int | None, out: Path, args: list[str]
) -> list[str]:
    """The recipe's fit command for one variant (``args``: its own settings), ended by the time budget."""
    return [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(config),
        "--trainer.max_time", f"00:00:{int(minutes):02d}:{round(minutes % 1 * 60):02d}",
        *(["--trainer.val_check_interval", str(eval_every)] if eval_every else []),
        "--trainer.default_root_dir", str(out / name),
        *args,
    ]  # fmt: skip


def start(cmd: list[str], log_path: Path, threads: int | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ROLL_STEPS": "100000"}  # the time budget ends the run
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with log_path.open("w") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_all(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Every estimator's run, in turn or (``--parallel``) at once; their summaries in the estimators' order."""
    results: dict[str, dict[str, Any]] = {}
    running: dict[str, tuple[list[str], subprocess.Popen[bytes], float]] = {}

    def finish(estimator: str) -> None:
        cmd, proc, started = running.pop(estimator)
        if proc.wait():
            raise SystemExit(f"{estimator}: the run failed; see {out / f'{estimator}.log'}")
        results[estimator] = summarise(estimator, cmd, out / estimator, time.perf_counter() - started)

    for estimator in args.estimators:
        extra = ["--model.algorithm.estimator", estimator, *args.extra]
        cmd = fit_command(args.config, estimator, args.minutes, args.eval_every, out, extra)
        running[estimator] = (cmd, start(cmd, out / f"{estimator}.log", args.threads), time.perf_counter())
        if not args.parallel:
            finish(estimator)
    for estimator in list(running):
        finish(estimator)
    return [results[e] for e in args.estimators]


def summarise(estimator: str, cmd: list[str], run_dir: Path, wall: float) -> dict[str, Any]:
    """One run's curve and timings, from its metrics.csv."""
    series = read_metrics(run_dir)
    elapsed = dict(series.get("timing/elapsed_s_total", []))
    # An evaluation logged at step s ran after training step s: it started at that step's elapsed time. The
    # one before any update (at_fit_start) is logged at step 0 too, and started at 0.
    # env steps played up to each training step: turns per episode times episodes (branching rollouts play fewer)
    played = dict(series.get("rollout/episodes", []))
    steps_so_far, total = {}, 0.0
    for step, turns in series.get("rollout/turns_mean", []):
        total += turns * played.get(step, 0.0)
        steps_so_far[step] = total
    evals = [
        {"step": step, "minutes": (elapsed.get(step, 0.0) if i else 0.0) / 60, "success": value,
         "env_steps": steps_so_far.get(step, 0.0) if i else 0.0}
        # runs before issue 14 logged it as rollout/eval_success_rate
        for i, (step, value) in enumerate(series.get("eval/success_rate") or series["rollout/eval_success_rate"])
    ]  # fmt: skip
    train_s = max(elapsed.values(), default=0.0)

    def median(key: str) -> float:
        return statistics.median(v for _, v in series[key]) if key in series else float("nan")

    return {
        "estimator": estimator,
        "command": " ".join(cmd),
        "process_wall_s": wall,
        "train_s": train_s,
        "rollout_steps": len(series.get("timing/step_s", [])),
        "step_s_median": median("timing/step_s"),
        "split_s_median": {k: median(f"timing/{k}_s") for k in ("rollout", "train")} | {"sync": median("sync/total_s")},
        # Wall time outside the training steps: the evaluations, checkpoints and logging.
        "outside_steps_share": 1 - sum(v for _, v in series["timing/step_s"]) / train_s if train_s else float("nan"),
        "evals": evals,
        "train_success": series.get("rollout/success_rate", []),
        "train_invalid": series.get("rollout/invalid_action_rate", []),
        "train_ppo_kl": series.get("train/ppo_kl", []),
    }


def plot(results: list[dict[str, Any]], path: Path, minutes: float, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for res in results:
        steps = [e["step"] for e in res["evals"]]
        success = [100 * e["success"] for e in res["evals"]]
        (line,) = by_step.plot(steps, success, marker="o", ms=3, label=f"{res['estimator']} (held-out)")
        train = res["train_success"]
        window = 25
        smooth = [
            100 * sum(v for _, v in train[max(0, i - window + 1) : i + 1]) / len(train[max(0, i - window + 1) : i + 1])
            for i in range(len(train))
        ]
        by_step.plot([s for s, _ in train], smooth, color=line.get_color(), alpha=0.35, lw=1,
                     label=f"{res['estimator']} (training episodes, sampled, mean of {window} steps)")  # fmt: skip
        by_time.plot([e["minutes"] for e in res["evals"]], success, marker="o", ms=3, color=line.get_color(),
                     label=res["estimator"])  # fmt: skip
    by_step.set(xlabel="rollout step (64 episodes each)", ylabel="success rate, % (sampled, T=1)", ylim=(0, 100))
    by_step.set_title("held-out success vs rollout steps", fontsize=9)
    by_time.set_title("held-out success vs wall-clock minutes", fontsize=9)
    by_time.set(xlabel="wall-clock minutes of training (evaluations included)", xlim=(0, minutes))
    by_step.legend(fontsize=7, loc="upper left")
    by_time.legend(fontsize=8, loc="upper left")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG, help="the recipe (default: the main command's)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training budget per estimator")
    ap.add_argument("--parallel", action="store_true", help="run the estimators at the same time")
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS per run (default: 1 with --parallel)")
    ap.add_argument("--estimators", nargs="*", default=["grpo", "gigpo"])
    ap.add_argument("--eval-every", type=int, default=None, help="rollout steps between evaluations (the config's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="write the curves here (PNG)")
    ap.add_argument("--from-summary", type=Path, default=None, help="redraw --plot from a run's summary.json")
    ap.add_argument(
        "--add", nargs="*", default=[], metavar="NAME=RUN_DIR",
        help="also report runs made elsewhere, e.g. the main command's: gigpo=runs/sokoban",
    )  # fmt: skip
    ap.add_argument("extra", nargs="*", help="more fit arguments, after --, e.g. -- --seed_everything 1")
    args = ap.parse_args()
    args.config = args.config.resolve()
    title = TITLES.get(args.config.stem, args.config.stem)
    if args.threads is None and args.parallel:
        args.threads = 1
    if args.from_summary:
        summary = json.loads(args.from_summary.read_text())
        plot(summary["results"], args.plot or args.from_summary.with_suffix(".png"), summary["minutes"], title)
        return
    bench_run = Run("learning")
    out = bench_run.directory(args.out)
    results = run_all(args, out) if args.estimators else []
    for name, _, run_dir in (item.partition("=") for item in args.add):
        results.append(summarise(name, ["(run elsewhere)", run_dir], Path(run_dir), float("nan")))
    summary = {
        "minutes": args.minutes,
        "config": str(args.config.relative_to(REPO)) if args.config.is_relative_to(REPO) else str(args.config),
        "parallel": args.parallel,
        "threads": args.threads,
        "results": results,
    }
    bench_run.write(summary, out / "summary.json")
    print("| estimator | eval at step 0 | +25 pts first reached | best eval | last eval | gain (last - step 0) "
          "| rollout steps | step s (median): rollout / train / sync | outside steps | training min |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        evals = res["evals"]
        first, last = evals[0]["success"], evals[-1]["success"]
        best = max(evals, key=lambda e: e["success"])
        hit = next((e for e in evals if e["success"] - first >= 0.25), None)
        reached = f"step {hit['step']} ({hit['success']:.1%}), {hit['minutes']:.1f} min" if hit else "not reached"
        split = " / ".join(f"{v:.2f}" for v in res["split_s_median"].values())
        print(f"| {res['estimator']} | {first:.1%} | {reached} | {best['success']:.1%} (step {best['step']}) | "
              f"{last:.1%} (step {evals[-1]['step']}) | {100 * (last - first):+.1f} pts | {res['rollout_steps']} | "
              f"{res['step_s_median']:.2f}: {split} | {res['outside_steps_share']:.0%} | "
              f"{res['train_s'] / 60:.1f} |")  # fmt: skip
    if args.plot:
        plot(results, args.plot, args.minutes, title)
        print(f"plot: {args.plot}")
    print(bench_run.footer())
    print(f"results: {out}")


if __name__ == "__main__":
    main()
