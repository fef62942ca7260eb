"""roll_lightning beside TRL's GRPOTrainer: the same model, env, boards and wall-clock budget (issue 36).

Three variants by default and a fourth on request (``--variants``), run one after the other (each alone on the
machine), in rounds, so the machine's drift hits all of them alike:
- ``ours``: ``fit --config configs/frozenlake_learn.yaml`` as shipped (GRPO on step rows: each turn sees only
  the current board);
- ``ours-trajectory``: the same with ``layout: trajectory`` (each turn sees the episode so far), the form TRL
  trains in: the like-for-like comparison;
- ``ours-lockstep``: trajectory rows played in lock step (``data.rollout.mode: lockstep``: every live episode
  takes its turn in one batched call), as the TRL side plays; not the default, because async wins once env steps
  have latency (docs/benchmarks.md, "Rollout");
- ``trl``: `bench/trl_frozenlake.py`, TRL's `GRPOTrainer` with a ``rollout_func`` that plays our FrozenLake
  server (its docstring lists every setting and what could not be matched).

Each run: the tiny-words model from scratch, group size 8, 64 episodes per update, lr 5e-4, clip 0.2, one torch
thread, ``--minutes`` of training with held-out success (128 odd-seed boards, temperature 1) evaluated about
once a minute and at the end, evaluations inside the budget on both sides. Reported per variant, medians over
the rounds: seconds per update, episodes/s, generated tokens/s, the trainer process's peak RSS (env servers
excluded on both sides), held-out success at the end and the first time it was 30 points above the start.

``--model smollm2`` runs the same three on ``configs/frozenlake_llm.yaml`` (SmolLM2-135M-Instruct, the LLM
recipe's settings; GRPO on trajectory rows, since GiGPO needs step rows), without held-out play (`SETUPS`).

Run:  .venv/bin/python bench/vs_trl.py --minutes 10 --rounds 3      (about 1.5 hours)
      .venv/bin/python bench/vs_trl.py --minutes 1 --rounds 1       (a quick look)
      .venv/bin/python bench/vs_trl.py --model smollm2 --minutes 6 --rounds 1   (about 21 minutes)
Writes bench/results/vs_trl[_smollm2]-<utc time>/{<variant>-<round>/..., summary.json} (or ``--out``) and prints a
markdown table.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402

VARIANTS = ("ours", "ours-trajectory", "ours-lockstep", "trl")
GAIN = 0.30  # the held-out gain whose first time is reported


@dataclass(frozen=True)
class Setup:
    """One model's recipe on both sides."""

    config: str  # ours as shipped; the TRL side reads its settings from it too (`bench/trl_recipe.Recipe`)
    context_tokens: int  # trajectory rows: an 8-turn episode must fit
    trajectory: tuple[str, ...] = ()  # what else ours needs on trajectory rows
    trl: tuple[str, ...] = ()  # what else the TRL side needs
    held_out: bool = True  # evaluate on the held-out boards (SmolLM2: 64 episodes cost ~3 min on one thread)


SETUPS = {
    "tiny": Setup("configs/frozenlake_learn.yaml", 256),
    # GiGPO needs step rows: on trajectory rows both sides run GRPO (mean-centred, as the recipe's norm_by_std)
    "smollm2": Setup(
        "configs/frozenlake_llm.yaml", 1024, ("--model.algorithm.estimator", "grpo"),
        ("--micro-episodes", "4"), held_out=False,
    ),
}  # fmt: skip


def command(variant: str, setup: Setup, minutes: float, out: Path) -> list[str]:
    if variant == "trl":
        return [
            sys.executable, str(REPO / "bench" / "trl_frozenlake.py"), "--minutes", str(minutes), "--out", str(out),
            "--config", str(REPO / setup.config), "--max-context-tokens", str(setup.context_tokens), *setup.trl,
            *(() if setup.held_out else ("--no-held-out",)),
        ]  # fmt: skip
    budget = f"00:00:{int(minutes):02d}:{round(60 * (minutes % 1)):02d}"  # Lightning's DD:HH:MM:SS
    trajectory = [
        "--data.rollout.episode.layout", "trajectory",
        "--data.rollout.episode.max_context_tokens", str(setup.context_tokens), *setup.trajectory,
    ]  # fmt: skip
    evaluation = ["--trainer.val_check_interval", "100"]
    if not setup.held_out:
        evaluation = ["--data.evaluation.at_fit_start", "false", "--data.evaluation.during_fit", "false"]
    return [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(REPO / setup.config),
        "--model.rollout_steps", "1000000", "--trainer.max_time", budget, *evaluation,
        "--trainer.default_root_dir", str(out), "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(out),
        *(trajectory if variant in ("ours-trajectory", "ours-lockstep") else []),
        *(["--data.rollout.mode", "lockstep"] if variant == "ours-lockstep" else []),
    ]  # fmt: skip


def run_one(variant: str, setup: Setup, minutes: float, out: Path) -> dict[str, Any]:
    """Run a variant to its end; its measures (`ours_measures` / `trl_measures`) and its peak RSS."""
    out.mkdir(parents=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ROLL_LIGHTNING_CACHE": str(out.parent / "cache")}
    with (out / "stderr.txt").open("w") as err:
        proc = subprocess.Popen(
            command(variant, setup, minutes, out), cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
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
    evals = [
        (elapsed.get(int(r["step"]), 0.0), float(r["eval/success_rate"])) for r in rows if r.get("eval/success_rate")
    ]
    seconds = sum(float(r["timing/step_s"]) for r in steps)
    episodes = sum(float(r["rollout/episodes"]) for r in steps)
    env_steps = sum(float(r["rollout/episodes"]) * float(r["rollout/turns_mean"]) for r in steps)
    tokens = sum(
        float(r["rollout/episodes"]) * float(r["rollout/turns_mean"]) * float(r["rollout/response_tokens_mean"])
        for r in steps
    )
    update_s = [float(r["timing/step_s"]) for r in steps]
    return summary(len(steps), update_s, episodes, env_steps, tokens, seconds, evals)


def trl_measures(out: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (out / "trl_metrics.jsonl").open()]
    updates = [r for r in rows if r["kind"] == "update"]
    evals = [(r["elapsed_s"], r["success_rate"]) for r in rows if r["kind"] == "eval"]
    seconds = sum(r["wall_s"] for r in updates)
    episodes, tokens = sum(r["episodes"] for r in updates), sum(r["gen_tokens"] for r in updates)
    env_steps = sum(r["env_steps"] for r in updates)
    return summary(len(updates), [r["wall_s"] for r in updates], episodes, env_steps, tokens, seconds, evals)


def summary(
    updates: int,
    update_s: list[float],
    episodes: float,
    env_steps: float,
    tokens: float,
    seconds: float,
    evals: list[tuple[float, float]],
) -> dict[str, Any]:
    first = evals[0][1] if evals else None
    reached = next((t for t, s in evals if s - first >= GAIN - 1e-9), None) if evals else None
    return {
        "updates": updates,
        "s_per_update": round(statistics.median(update_s), 3),
        "episodes_per_s": round(episodes / seconds, 2),
        "env_steps_per_s": round(env_steps / seconds, 2),
        "gen_tokens_per_s": round(tokens / seconds, 1),
        "heldout_first": None if first is None else round(first, 3),
        "heldout_last": round(evals[-1][1], 3) if evals else None,
        "s_to_plus_30": None if reached is None else round(reached, 1),
        "evals": [(round(t, 1), round(s, 3)) for t, s in evals],
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("updates", "s_per_update", "episodes_per_s", "env_steps_per_s", "gen_tokens_per_s", "peak_rss_mb")
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in keys}
    for k in ("heldout_first", "heldout_last"):
        out[k] = None if None in (r[k] for r in runs) else statistics.median(r[k] for r in runs)
    reached = [r["s_to_plus_30"] for r in runs]
    out["s_to_plus_30"] = statistics.median(reached) if None not in reached else reached
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    default = [v for v in VARIANTS if v != "ours-lockstep"]
    parser.add_argument("--variants", nargs="+", default=default, choices=VARIANTS)
    parser.add_argument("--model", default="tiny", choices=sorted(SETUPS), help="whose recipe (`SETUPS`)")
    parser.add_argument("--out", type=Path, default=None, help="the run folder (default bench/results/vs_trl-<time>)")
    args = parser.parse_args()
    setup = SETUPS[args.model]
    run = Run("vs_trl" if args.model == "tiny" else f"vs_trl_{args.model}", quick=args.minutes < 5)
    folder = run.directory(args.out)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    for k in range(args.rounds):
        for variant in args.variants:
            started = time.time()
            result = run_one(variant, setup, args.minutes, folder / f"{variant}-{k}")
            results[variant].append(result)
            print(f"round {k} {variant}: {json.dumps(result)} ({time.time() - started:.0f} s)", flush=True)
    table = {v: medians(rs) for v, rs in results.items()}
    import trl

    machine = {"trl": trl.__version__, "model": args.model, "config": setup.config}
    run.write({"machine": machine, "runs": results, "medians": table}, folder / "summary.json")
    print(
        "| variant | updates | s/update | episodes/s | env steps/s | gen tokens/s | peak RSS MB | held-out | s to +30 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for variant, m in table.items():
        held = "-" if m["heldout_first"] is None else f"{m['heldout_first']:.3f} -> {m['heldout_last']:.3f}"
        print(
            f"| {variant} | {m['updates']:g} | {m['s_per_update']:.3f} | {m['episodes_per_s']:.2f} | "
            f"{m['env_steps_per_s']:.2f} | {m['gen_tokens_per_s']:.1f} | {m['peak_rss_mb']:.0f} | {held} | "
            f"{m['s_to_plus_30']} |"
        )
    print(run.footer())


if __name__ == "__main__":
    main()
