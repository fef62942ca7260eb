"""The curve of an LLM recipe run (issue 30): held-out success and invalid replies against rollout steps and
wall-clock minutes, read from the run's ``metrics.csv``, one PNG; and the numbers the benchmark page quotes
(each evaluation, the step-time split, the first evaluation at or under an invalid-reply share, the median
success of the last three evaluations).

Run:  .venv/bin/python bench/llm_curve.py runs/frozenlake_llm --plot docs/frozenlake_llm_curve.png
      .venv/bin/python bench/llm_curve.py runs/a runs/b --names lr1e-5 lr2e-5     (several runs on one figure)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.learning_curve import read_metrics  # noqa: E402


def summarize(run: Path) -> dict[str, Any]:
    """Each evaluation (step, minutes, success, invalid) and the medians of the step-time split."""
    series = read_metrics(run)
    elapsed = dict(series.get("timing/elapsed_s_total", []))
    invalid = dict(series.get("eval/invalid_action_rate", []))
    evals = [
        {"step": step, "minutes": elapsed.get(step, 0.0) / 60, "success": value, "invalid": invalid.get(step)}
        for step, value in series["eval/success_rate"]
    ]
    split = {
        key: statistics.median(v for _, v in series[f"timing/{key}_s"])
        for key in ("step", "rollout", "train", "sync")
        if series.get(f"timing/{key}_s")
    }
    last3 = [e["success"] for e in evals[-3:]]
    return {"run": str(run), "evals": evals, "step_split_s": split, "last3_median_success": statistics.median(last3)}


def plot(summaries: list[dict[str, Any]], names: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for summary, name in zip(summaries, names, strict=True):
        evals = summary["evals"]
        success = [100 * e["success"] for e in evals]
        invalid = [100 * (e["invalid"] or 0.0) for e in evals]
        for ax, x in ((by_step, [e["step"] for e in evals]), (by_time, [e["minutes"] for e in evals])):
            (line,) = ax.plot(x, success, marker="o", ms=3, label=f"{name}: held-out success")
            ax.plot(x, invalid, marker="x", ms=3, ls="--", color=line.get_color(), label=f"{name}: invalid replies")
    by_step.set(xlabel="rollout step", ylabel="% of held-out episodes / replies (sampled, T=1)", ylim=(0, 100))
    by_time.set(xlabel="wall-clock minutes (evaluations included)")
    for ax in (by_step, by_time):
        ax.axhline(40, color="grey", lw=0.8, ls=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="run folders (trainer.default_root_dir)")
    ap.add_argument("--names", nargs="*", help="a legend name per run (default: the folder names)")
    ap.add_argument("--plot", type=Path, help="write the figure here")
    ap.add_argument(
        "--title", default="SmolLM2-135M-Instruct on FrozenLake 4x4, strict <answer> format, GiGPO, 2-core CPU"
    )
    args = ap.parse_args()
    names = args.names or [run.name for run in args.runs]
    summaries = [summarize(run) for run in args.runs]
    for summary, name in zip(summaries, names, strict=True):
        print(f"{name}: step time (median) {summary['step_split_s']}")
        print("| step | minutes | held-out success | invalid replies |\n|---|---|---|---|")
        for e in summary["evals"]:
            invalid = "" if e["invalid"] is None else f"{100 * e['invalid']:.1f}%"
            print(f"| {e['step']} | {e['minutes']:.1f} | {100 * e['success']:.1f}% | {invalid} |")
        print(f"median of the last three evaluations: {100 * summary['last3_median_success']:.1f}%")
    if args.plot:
        plot(summaries, names, args.plot, args.title)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
