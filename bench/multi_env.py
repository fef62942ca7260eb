"""Multi-env benchmark (issue 15): does training Sokoban and FrozenLake together help, hurt, or neither?

Three runs of ``configs/sokoban_frozenlake.yaml`` side by side (at the same time, one torch thread each, the same
wall-clock budget, so they share the machine's load): both envs together (4 + 4 groups per rollout step), Sokoban
alone (8 groups) and FrozenLake alone (8 groups). "Alone" keeps the entry's tag, so it plays the same training
and held-out seeds as in the mixed run; every run evaluates both envs (128 held-out starts each, T=1, before the
first update and every ``--eval-every`` steps), so the alone runs also show what one env's training does to the
other env.

Run:  .venv/bin/python bench/multi_env.py --minutes 20 --plot docs/multi_env_curve.png
Writes bench/results/multi-env-<utc time>/{<variant>/..., summary.json} and, with --plot, a PNG of the curves.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml
from learning_curve import REPO, Run, fit_command, read_metrics, start

CONFIG = REPO / "configs" / "sokoban_frozenlake.yaml"
TAGS = ("sokoban", "frozenlake")


def variants(config: Path) -> dict[str, list[dict[str, Any]]]:
    """Each variant's training env list: the recipe's, and each of its entries alone with the whole batch."""
    recipe = yaml.safe_load(config.read_text())
    rollout = recipe["data"]["rollout"]
    envs, total = rollout["envs"], rollout["batch_size"] // rollout["group_size"]
    return {"mixed": envs, **{entry["tag"]: [{**entry, "groups": total}] for entry in envs}}


def summarise(name: str, cmd: list[str], run_dir: Path) -> dict[str, Any]:
    series = read_metrics(run_dir)
    elapsed = dict(series.get("timing/elapsed_s_total", []))

    def curve(key: str) -> list[dict[str, float]]:
        return [
            {"step": step, "minutes": (elapsed.get(step, 0.0) if i else 0.0) / 60, "success": value}
            for i, (step, value) in enumerate(series.get(key, []))
        ]

    return {
        "variant": name,
        "command": " ".join(cmd),
        "rollout_steps": len(series.get("timing/step_s", [])),
        "train_minutes": max(elapsed.values(), default=0.0) / 60,
        "evals": {tag: curve(f"eval/{tag}/success_rate") for tag in TAGS},
        "episodes": {tag: sum(v for _, v in series.get(f"rollout/{tag}/episodes", [])) for tag in TAGS},
    }


def plot(results: list[dict[str, Any]], path: Path, minutes: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TAGS), figsize=(11, 4), sharey=True)
    for ax, tag in zip(axes, TAGS, strict=True):
        for res in results:
            evals = res["evals"][tag]
            trained = "trained" if res["variant"] in ("mixed", tag) else "not trained on"
            ax.plot([e["minutes"] for e in evals], [100 * e["success"] for e in evals], marker="o", ms=3,
                    ls="-" if trained == "trained" else ":", label=f"{res['variant']} ({trained} {tag})")  # fmt: skip
        ax.set(title=f"held-out {tag} success vs minutes", xlabel="wall-clock minutes (evaluations included)",
               xlim=(0, minutes), ylim=(0, 100))  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("success rate, % (128 held-out starts, T=1)")
    fig.suptitle("Sokoban + FrozenLake together vs each alone: tiny-grid from scratch, 3 runs side by side, 2-core CPU",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--minutes", type=float, default=20.0, help="training budget of every run")
    ap.add_argument("--eval-every", type=int, default=None, help="rollout steps between evaluations (the config's)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--from-summary", type=Path, default=None, help="redraw --plot from a run's summary.json")
    args = ap.parse_args()
    if args.from_summary:
        summary = json.loads(args.from_summary.read_text())
        plot(summary["results"], args.plot or args.from_summary.with_suffix(".png"), summary["minutes"])
        return
    bench_run = Run("multi-env")
    out = bench_run.directory(args.out)
    running = {}
    train_lists = variants(args.config)
    held_out = [{k: v for k, v in entry.items() if k != "groups"} for entry in train_lists["mixed"]]
    for name, envs in train_lists.items():
        override = out / f"{name}.yaml"  # every run evaluates every env, on the same held-out starts
        override.write_text(yaml.safe_dump({"data": {"rollout": {"envs": envs}, "evaluation": {"envs": held_out}}}))
        cmd = fit_command(args.config, name, args.minutes, args.eval_every, out, ["--config", str(override)])
        running[name] = (cmd, start(cmd, out / f"{name}.log", threads=1), time.perf_counter())
    results = []
    for name, (cmd, proc, _) in running.items():
        if proc.wait():
            raise SystemExit(f"{name}: the run failed; see {out / f'{name}.log'}")
        results.append(summarise(name, cmd, out / name))
    bench_run.write({"minutes": args.minutes, "results": results}, out / "summary.json")
    print(
        "| run | rollout steps | "
        + " | ".join(f"{t} episodes | {t} held-out: first / best / last" for t in TAGS)
        + " |"
    )
    print("|---|---|" + "---|---|" * len(TAGS))
    for res in results:
        cells = []
        for tag in TAGS:
            evals = res["evals"][tag]
            first, last = evals[0]["success"], evals[-1]["success"]
            best = max(e["success"] for e in evals)
            cells += [
                f"{res['episodes'][tag]:,.0f}",
                f"{first:.1%} / {best:.1%} / {last:.1%} ({100 * (last - first):+.1f})",
            ]
        print(f"| {res['variant']} | {res['rollout_steps']} | " + " | ".join(cells) + " |")
    if args.plot:
        plot(results, args.plot, args.minutes)
        print(f"plot: {args.plot}")
    print(bench_run.footer())
    print(f"results: {out}")


if __name__ == "__main__":
    main()
