"""roll_lightning beside TRL's GRPOTrainer: the same model, env, boards and wall-clock budget (issue 36).

Three variants, run one after the other (each alone on the machine), in rounds, so the machine's drift hits all
of them alike:
- ``ours``: ``fit --config configs/frozenlake_learn.yaml`` as shipped (GRPO on step rows: each turn sees only
  the current board);
- ``ours-trajectory``: the same with ``layout: trajectory`` (each turn sees the episode so far), the form TRL
  trains in: the like-for-like comparison;
- ``trl``: `bench/trl_frozenlake.py`, TRL's `GRPOTrainer` with a ``rollout_func`` that plays our FrozenLake
  server (its docstring lists every setting and what could not be matched).

Each run: the tiny-words model from scratch, group size 8, 64 episodes per update, lr 5e-4, clip 0.2, one torch
thread, ``--minutes`` of training with held-out success (128 odd-seed boards, temperature 1) evaluated about
once a minute and at the end, evaluations inside the budget on both sides. Reported per variant, medians over
the rounds: seconds per update, episodes/s, generated tokens/s, the trainer process's peak RSS (env servers
excluded on both sides), held-out success at the end and the first time it was 30 points above the start.

Run:  .venv/bin/python bench/vs_trl.py --minutes 10 --rounds 3      (about 1.5 hours)
      .venv/bin/python bench/vs_trl.py --minutes 1 --rounds 1       (a quick look)
Writes bench/results/vs_trl-<utc time>/{<variant>-<round>/..., summary.json} and prints a markdown table.
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

from bench.support.results import Run  # noqa: E402

VARIANTS = ("ours", "ours-trajectory", "trl")
TRAJECTORY = ["--data.rollout.episode.layout", "trajectory", "--data.rollout.episode.max_context_tokens", "256"]
GAIN = 0.30  # the held-out gain whose first time is reported


def command(variant: str, minutes: float, out: Path) -> list[str]:
    if variant == "trl":
        return [sys.executable, str(REPO / "bench" / "trl_frozenlake.py"), "--minutes", str(minutes), "--out", str(out)]
    budget = f"00:00:{int(minutes):02d}:{round(60 * (minutes % 1)):02d}"  # Lightning's DD:HH:MM:SS
    return [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(REPO / "configs" / "frozenlake_learn.yaml"),
        "--model.rollout_steps", "1000000", "--trainer.max_time", budget, "--trainer.val_check_interval", "100",
        "--trainer.default_root_dir", str(out), "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(out),
        *(TRAJECTORY if variant == "ours-trajectory" else []),
    ]  # fmt: skip


def run_one(variant: str, minutes: float, out: Path) -> dict[str, Any]:
    """Run a variant to its end; its measures (`ours_measures` / `trl_measures`) and its peak RSS."""
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROLL_LIGHTNING_CACHE": str(out.parent / "cache")}
    with (out / "stderr.txt").open("w") as err:
        proc = subprocess.Popen(command(variant, minutes, out), cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{variant} failed (status {status}); see {out / 'stderr.txt'}")
    measures = trl_measures(out) if variant == "trl" else ours_measures(out)
    return {**measures, "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def ours_measures(out: Path) -> dict[str, Any]:
    """From the run's metrics.csv: per-step timing and counts, and the evaluations with their elapsed time."""
    rows = list(csv.DictReader(next(out.rglob("metrics.csv")).open()))
    steps = [r for r in rows if r.get("timing/step_s")]
    elapsed = {int(r["step"]): float(r["timing/elapsed_s_total"]) for r in steps if r.get("timing/elapsed_s_total")}
    evals = [(elapsed.get(int(r["step"]), 0.0), float(r["eval/success_rate"])) for r in rows if r["eval/success_rate"]]
    seconds = sum(float(r["timing/step_s"]) for r in steps)
    episodes = sum(float(r["rollout/episodes"]) for r in steps)
    tokens = sum(
        float(r["rollout/episodes"]) * float(r["rollout/turns_mean"]) * float(r["rollout/response_tokens_mean"])
        for r in steps
    )
    return summary(len(steps), [float(r["timing/step_s"]) for r in steps], episodes, tokens, seconds, evals)


def trl_measures(out: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (out / "trl_metrics.jsonl").open()]
    updates = [r for r in rows if r["kind"] == "update"]
    evals = [(r["elapsed_s"], r["success_rate"]) for r in rows if r["kind"] == "eval"]
    seconds = sum(r["wall_s"] for r in updates)
    episodes, tokens = sum(r["episodes"] for r in updates), sum(r["gen_tokens"] for r in updates)
    return summary(len(updates), [r["wall_s"] for r in updates], episodes, tokens, seconds, evals)


def summary(
    updates: int,
    update_s: list[float],
    episodes: float,
    tokens: float,
    seconds: float,
    evals: list[tuple[float, float]],
) -> dict[str, Any]:
    first = evals[0][1]
    reached = next((t for t, s in evals if s - first >= GAIN - 1e-9), None)
    return {
        "updates": updates,
        "s_per_update": round(statistics.median(update_s), 3),
        "episodes_per_s": round(episodes / seconds, 1),
        "gen_tokens_per_s": round(tokens / seconds, 1),
        "heldout_first": round(first, 3),
        "heldout_last": round(evals[-1][1], 3),
        "s_to_plus_30": None if reached is None else round(reached, 1),
        "evals": [(round(t, 1), round(s, 3)) for t, s in evals],
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("updates", "s_per_update", "episodes_per_s", "gen_tokens_per_s", "peak_rss_mb", "heldout_first")
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in (*keys, "heldout_last")}
    reached = [r["s_to_plus_30"] for r in runs]
    out["s_to_plus_30"] = statistics.median(reached) if None not in reached else reached
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()
    run = Run("vs_trl", quick=args.minutes < 5)
    folder = run.directory()
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    for k in range(args.rounds):
        for variant in args.variants:
            started = time.time()
            result = run_one(variant, args.minutes, folder / f"{variant}-{k}")
            results[variant].append(result)
            print(f"round {k} {variant}: {json.dumps(result)} ({time.time() - started:.0f} s)", flush=True)
    table = {v: medians(rs) for v, rs in results.items()}
    import trl

    run.write({"machine": {"trl": trl.__version__}, "runs": results, "medians": table}, folder / "summary.json")
    print(
        "| variant | updates | s/update | episodes/s | gen tokens/s | peak RSS MB | held-out first -> last | s to +30 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for variant, m in table.items():
        print(
            f"| {variant} | {m['updates']:g} | {m['s_per_update']:.3f} | {m['episodes_per_s']:.1f} | "
            f"{m['gen_tokens_per_s']:.1f} | {m['peak_rss_mb']:.0f} | {m['heldout_first']:.3f} -> "
            f"{m['heldout_last']:.3f} | {m['s_to_plus_30']} |"
        )
    print(run.footer())


if __name__ == "__main__":
    main()
