"""Learning benchmark (issue 6): does the CPU recipe learn FrozenLake, GRPO vs GiGPO, in a fixed wall-clock budget?

Each estimator runs ``python -m roll_lightning fit --config configs/frozenlake_learn.yaml`` as its own process,
one after the other (each gets the whole machine), with ``--trainer.max_time`` = the budget. The recipe evaluates
the untrained policy before the first update (step 0) and then every ``--eval-every`` rollout steps, on the same
held-out map seeds (odd seeds; training plays even ones), through the same evaluation path as ``validate``. The
budget counts from the start of training and includes those evaluations; the process start (model build, env
server launch) is reported separately.

Run:  .venv/bin/python bench/learning_curve.py --plot docs/learning_curve.png   (2 x 15 minutes)
      .venv/bin/python bench/learning_curve.py --minutes 2                      (a quick look)
Writes bench/results/learning-<utc time>/{<estimator>/..., summary.json} and, with --plot, a PNG of the curves.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "frozenlake_learn.yaml"


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


def fit_command(name: str, minutes: float, eval_every: int, out: Path, args: list[str]) -> list[str]:
    """The recipe's fit command for one variant (``args``: its own settings), ended by the time budget."""
    return [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(CONFIG),
        "--trainer.max_time", f"00:00:{int(minutes):02d}:{round(minutes % 1 * 60):02d}",
        "--trainer.val_check_interval", str(eval_every),
        "--trainer.default_root_dir", str(out / name),
        *args,
    ]  # fmt: skip


def start(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ROLL_STEPS": "100000", "OMP_NUM_THREADS": "1"}  # the time budget ends the run
    with log_path.open("w") as log:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_one(estimator: str, minutes: float, eval_every: int, out: Path, extra: list[str]) -> dict[str, Any]:
    cmd = fit_command(estimator, minutes, eval_every, out, ["--model.algorithm.estimator", estimator, *extra])
    started = time.perf_counter()
    if start(cmd, out / f"{estimator}.log").wait():
        raise SystemExit(f"{estimator}: the run failed; see {out / f'{estimator}.log'}")
    return summarise(estimator, cmd, out / estimator, time.perf_counter() - started)


def summarise(estimator: str, cmd: list[str], run_dir: Path, wall: float) -> dict[str, Any]:
    """One run's curve and timings, from its metrics.csv."""
    series = read_metrics(run_dir)
    elapsed = dict(series.get("timing/elapsed_s", []))
    # An evaluation logged at step s ran after training step s: it started at that step's elapsed time. The
    # one before any update (at_fit_start) is logged at step 0 too, and started at 0.
    evals = [
        {"step": step, "minutes": (elapsed.get(step, 0.0) if i else 0.0) / 60, "success": value}
        for i, (step, value) in enumerate(series["rollout/eval_success_rate"])
    ]
    return {
        "estimator": estimator,
        "command": " ".join(cmd),
        "process_wall_s": wall,
        "train_s": max(elapsed.values(), default=0.0),
        "rollout_steps": len(series.get("timing/step_s", [])),
        "step_s_median": statistics.median(v for _, v in series["timing/step_s"]),
        "evals": evals,
        "train_success": series.get("rollout/success_rate", []),
        "train_invalid": series.get("rollout/invalid_action_rate", []),
    }


def plot(results: list[dict[str, Any]], path: Path, minutes: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for res in results:
        steps = [e["step"] for e in res["evals"]]
        success = [100 * e["success"] for e in res["evals"]]
        (line,) = by_step.plot(steps, success, marker="o", ms=3, label=f"{res['estimator']} (held-out maps)")
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
    by_time.set(xlabel="wall-clock minutes of training (evaluations included)", xlim=(0, minutes))
    by_step.legend(fontsize=7, loc="upper left")
    by_time.legend(fontsize=8, loc="upper left")
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    fig.suptitle("FrozenLake 4x4 (random maps from seeds), tiny-words model from scratch, 2-core CPU", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="training budget per estimator")
    ap.add_argument("--estimators", nargs="+", default=["grpo", "gigpo"])
    ap.add_argument("--eval-every", type=int, default=50, help="rollout steps between evaluations")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None, help="write the curves here (PNG)")
    ap.add_argument("--from-summary", type=Path, default=None, help="redraw --plot from a run's summary.json")
    ap.add_argument("extra", nargs="*", help="more fit arguments, after --, e.g. -- --seed_everything 1")
    args = ap.parse_args()
    if args.from_summary:
        summary = json.loads(args.from_summary.read_text())
        plot(summary["results"], args.plot or args.from_summary.with_suffix(".png"), summary["minutes"])
        return
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO / "bench" / "results" / f"learning-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    results = [run_one(e, args.minutes, args.eval_every, out, args.extra) for e in args.estimators]
    summary = {
        "when": stamp,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_start": load_start,
            "load_end": os.getloadavg(),
        },  # fmt: skip
        "minutes": args.minutes,
        "results": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("| estimator | eval at step 0 | best eval | last eval | gain (last - step 0) | rollout steps "
          "| step s (median) | training min | process min |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for res in results:
        evals = res["evals"]
        first, last = evals[0]["success"], evals[-1]["success"]
        best = max(e["success"] for e in evals)
        print(f"| {res['estimator']} | {first:.1%} | {best:.1%} | {last:.1%} (step {evals[-1]['step']}) | "
              f"{100 * (last - first):+.1f} pts | {res['rollout_steps']} | {res['step_s_median']:.2f} | "
              f"{res['train_s'] / 60:.1f} | {res['process_wall_s'] / 60:.1f} |")  # fmt: skip
    if args.plot:
        plot(results, args.plot, args.minutes)
        print(f"plot: {args.plot}")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
