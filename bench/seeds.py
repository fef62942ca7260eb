"""The front door over seeds (issue 46): one recipe, several seeds, as a distribution per rollout step and per minute.

Every (variant, seed) pair runs ``python -m roll_lightning fit --config <config> --seed_everything <seed>`` as its own
process, ``--parallel`` at a time (one torch thread each when more than one), ended by ``--minutes`` of training or
by ``--steps`` rollout steps. Variants run side by side, seed by seed, so each variant sees the same load. The
report gives, for every variant, held-out success at fixed rollout steps, at fixed minutes and at fixed numbers of
env steps played (a branching rollout plays fewer per rollout step): each seed's value,
then the median, the worst and the spread (best - worst), and the same for the gain over the step-0 evaluation.

Run:  .venv/bin/python bench/seeds.py                         (the main command, seeds 0-4, 30 minutes each, in turn)
      .venv/bin/python bench/seeds.py --steps 400 --eval-every 100 --parallel 2 -- --data.evaluation.episodes 512
                                                               (the learning test's recipe over five seeds)
      .venv/bin/python bench/seeds.py --steps 400 --variant lr2.5e-4="--model.optim.lr 2.5e-4"   (a variant beside it)
      .venv/bin/python bench/seeds.py --from-summary bench/results/seeds-<utc>/summary.json      (report again)
                                                               (run folders still beside it are re-read)
Writes bench/results/seeds-<utc time>/{<variant>-seed<S>/..., <variant>-seed<S>.log, summary.json}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.learning_curve import CONFIG, start, summarise  # noqa: E402
from bench.support.results import Run  # noqa: E402

STEP_MARKS = (100, 200, 300, 400, 500, 1000, 1500, 2000, 2500)
MINUTE_MARKS = (5, 10, 20, 30)
ENV_STEP_MARKS = (25_000, 50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000)


def fit_command(config: Path, run_dir: Path, seed: int, args: argparse.Namespace, settings: list[str]) -> list[str]:
    """One seed's fit command: the budget (minutes or steps) and its evaluations, then the variant's settings."""
    budget = (
        ["--model.rollout_steps", str(args.steps), "--trainer.max_time", "null"]
        if args.steps
        else ["--trainer.max_time", f"00:00:{int(args.minutes):02d}:{round(args.minutes % 1 * 60):02d}"]
    )
    return [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(config), "--seed_everything", str(seed),
        *budget, "--trainer.default_root_dir", str(run_dir),
        *(["--trainer.val_check_interval", str(args.eval_every)] if args.eval_every else []),
        *args.extra, *settings,
    ]  # fmt: skip


def run_all(args: argparse.Namespace, variants: dict[str, list[str]], out: Path) -> list[dict[str, Any]]:
    """Every (variant, seed) run, ``args.parallel`` at a time, seed-major so variants share the load alike."""
    queue = [(name, seed) for seed in args.seeds for name in variants]
    threads = 1 if args.parallel > 1 else None
    running: list[tuple[str, int, list[str], subprocess.Popen[bytes], float]] = []
    results = []
    while queue or running:
        while queue and len(running) < args.parallel:
            name, seed = queue.pop(0)
            cmd = fit_command(args.config, out / f"{name}-seed{seed}", seed, args, variants[name])
            proc = start(cmd, out / f"{name}-seed{seed}.log", threads)
            running.append((name, seed, cmd, proc, time.perf_counter()))
        time.sleep(2)
        for item in [r for r in running if r[3].poll() is not None]:
            running.remove(item)
            name, seed, cmd, proc, began = item
            if proc.returncode:
                raise SystemExit(f"{name} seed {seed}: the run failed; see {out / f'{name}-seed{seed}.log'}")
            result = summarise(name, cmd, out / f"{name}-seed{seed}", time.perf_counter() - began)
            results.append(result | {"variant": name, "seed": seed})
            print(f"done: {name} seed {seed}, {gain_line(result)}", flush=True)
    return results


def refreshed(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A summary's result re-read from its run folder when that is still there (newer columns for older runs)."""
    run_dir = folder / f"{result['variant']}-seed{result['seed']}"
    if not run_dir.is_dir():
        return result
    return result | summarise(result["variant"], result["command"].split(), run_dir, result["process_wall_s"])


def gain_line(result: dict[str, Any]) -> str:
    evals = result["evals"]
    return f"held-out {evals[0]['success']:.1%} -> {evals[-1]['success']:.1%} at step {evals[-1]['step']}"


BURST_RATE = 0.3  # a batch with more invalid replies than this, after the first phase, is part of a burst
FAR_KL = 0.1  # an update whose train/ppo_kl exceeds this moved the policy far in one optimiser step


def stability(result: dict[str, Any], after: int = 100) -> str:
    """Bursts of invalid replies after step ``after`` (separate when 5+ steps apart: how many, batches in them)
    and updates with ``train/ppo_kl > FAR_KL``: each burst seen so far began with such an update (docs)."""
    steps = [s for s, rate in result.get("train_invalid", []) if s > after and rate > BURST_RATE]
    bursts = sum(1 for i, s in enumerate(steps) if i == 0 or s - steps[i - 1] >= 5)
    far = sum(1 for _, kl in result["train_ppo_kl"] if kl > FAR_KL) if "train_ppo_kl" in result else "-"
    return f"{bursts} ({len(steps)}) / {far}"


def at_mark(evals: list[dict[str, Any]], key: str, mark: float) -> float | None:
    """Held-out success of the last evaluation at or before ``mark`` (a step or a minute); None when the run
    never got there."""
    if max(e[key] for e in evals) < mark:
        return None
    return [e["success"] for e in evals if e[key] <= mark][-1]


def spread(values: list[float]) -> str:
    """``median, worst, spread`` in points."""
    if not values:
        return "-"
    pts = [100 * v for v in values]
    return f"{statistics.median(pts):.1f} / {min(pts):.1f} / {max(pts) - min(pts):.1f}"


def report(results: list[dict[str, Any]]) -> list[str]:
    """Markdown tables: per variant, held-out success and its gain at fixed steps and at fixed minutes."""
    lines = []
    for name in dict.fromkeys(r["variant"] for r in results):
        runs = sorted((r for r in results if r["variant"] == name), key=lambda r: r["seed"])
        lines += [f"\n**{name}** ({len(runs)} seeds: {', '.join(str(r['seed']) for r in runs)}; "
                  f"median s a step {statistics.median(r['step_s_median'] for r in runs):.2f})",
                  "", "| at | " + " | ".join(f"seed {r['seed']}" for r in runs)
                  + " | success: median / worst / spread | gain: median / worst / spread |",
                  "|---" * (len(runs) + 3) + "|"]  # fmt: skip
        last_step = max(r["evals"][-1]["step"] for r in runs)
        marks = [("step", m, f"step {m}") for m in (0, *STEP_MARKS) if m <= last_step]
        marks += [("minutes", m, f"{m} min") for m in MINUTE_MARKS]
        if all("env_steps" in e for r in runs for e in r["evals"]):  # summaries written before env steps lack them
            most = max(r["evals"][-1]["env_steps"] for r in runs)
            marks += [("env_steps", m, f"{m // 1000}k env steps") for m in ENV_STEP_MARKS if m <= most]
        marks += [("end", 0, "end"), ("mean", 0, "mean of the evaluations after step 0")]
        for key, mark, label in marks:
            cells, values, gains = [], [], []
            for r in runs:
                if key == "mean":
                    value = statistics.mean(e["success"] for e in r["evals"][1:]) if len(r["evals"]) > 1 else None
                else:
                    value = r["evals"][-1]["success"] if key == "end" else at_mark(r["evals"], key, mark)
                cells.append("-" if value is None else f"{value:.1%}")
                if value is not None:
                    values.append(value)
                    gains.append(value - r["evals"][0]["success"])
            if values:
                lines.append(f"| {label} | {' | '.join(cells)} | {spread(values)} | {spread(gains)} |")
        lines.append(f"| bursts (batches) / far updates | {' | '.join(stability(r) for r in runs)} | | |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG, help="the recipe (default: the main command's)")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument("--minutes", type=float, default=30.0, help="training budget per run (unless --steps)")
    ap.add_argument("--steps", type=int, default=None, help="end each run after this many rollout steps instead")
    ap.add_argument("--eval-every", type=int, default=None, help="rollout steps between evaluations (the config's)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (one torch thread each when above 1)")
    ap.add_argument(
        "--variant", action="append", default=[], metavar='NAME="SETTINGS"',
        help='a variant beside the recipe as written ("recipe"), e.g. lr2.5e-4="--model.optim.lr 2.5e-4"',
    )  # fmt: skip
    ap.add_argument("--no-recipe", action="store_true", help="only the --variant runs, not the recipe as written")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--from-summary", type=Path, default=None, help="print the report of an earlier summary.json")
    ap.add_argument("extra", nargs="*", help="fit arguments for every run, after --")
    args = ap.parse_args()
    if args.from_summary:
        summary = json.loads(args.from_summary.read_text())
        print("\n".join(report([refreshed(r, args.from_summary.parent) for r in summary["results"]])))
        return
    args.config = args.config.resolve()
    variants = ({} if args.no_recipe else {"recipe": []}) | {
        n: shlex.split(s) for n, _, s in (v.partition("=") for v in args.variant)
    }
    bench_run = Run("seeds")
    out = bench_run.directory(args.out)
    results = run_all(args, variants, out)
    summary = {"config": str(args.config), "steps": args.steps, "minutes": None if args.steps else args.minutes,
               "parallel": args.parallel, "variants": variants, "extra": args.extra, "results": results}  # fmt: skip
    bench_run.write(summary, out / "summary.json")
    print("\n".join(report(results)))
    print(bench_run.footer())
    print(f"results: {out}")


if __name__ == "__main__":
    main()
