"""A program per episode against one long-running agent (issue 47): the docs' example both ways, step by step.

Each round runs ``python -m roll_lightning fit --config configs/tiny.yaml --config <config>`` for ``--steps``
rollout steps with each agent config in turn: ``examples/agents/my_run.yaml`` (``my_agent.py`` started for every
episode) and ``examples/agents/my_service_run.yaml`` (``my_agent_service.py`` started once, ``lifetime: run``).
Both batches hold a group of 4 agent episodes and a group of 4 FrozenLake episodes. A round's figure per variant
is the median step time (and rollout time) over its steps after the first; the report gives each round's ratio
and the medians over rounds.

Run:  .venv/bin/python bench/agent_lifetime.py                 (3 rounds of 20 steps each)
Writes bench/results/agent-lifetime-<utc time>/{<variant>-round<R>/..., summary.json}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.learning_curve import read_metrics  # noqa: E402
from bench.support.results import Run  # noqa: E402

VARIANTS = {
    "per_episode": REPO / "examples" / "agents" / "my_run.yaml",
    "long_running": REPO / "examples" / "agents" / "my_service_run.yaml",
}


def one_run(config: Path, steps: int, out: Path) -> dict[str, float]:
    """One fit of ``steps`` rollout steps; the medians of its step and rollout seconds after the first step."""
    cmd = [
        sys.executable, "-m", "roll_lightning", "fit", "--config", str(REPO / "configs" / "tiny.yaml"),
        "--config", str(config), "--model.rollout_steps", str(steps), "--trainer.default_root_dir", str(out),
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(out),
    ]  # fmt: skip
    with (out.parent / f"{out.name}.log").open("w") as log:
        if subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"{out.name}: the run failed; see {out.parent / f'{out.name}.log'}")
    series = read_metrics(out)
    step = [v for _, v in series["timing/step_s"][1:]]
    rollout = [v for _, v in series["timing/rollout_s"][1:]]
    starts = series["rollout/agent_starts_total"][-1][1]
    return {"step_s": statistics.median(step), "rollout_s": statistics.median(rollout), "agent_starts": starts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    args = ap.parse_args()
    run = Run("agent-lifetime")
    out = run.directory()
    rounds = []
    for r in range(args.rounds):
        measured = {name: one_run(config, args.steps, out / f"{name}-round{r}") for name, config in VARIANTS.items()}
        measured["ratio"] = measured["per_episode"]["step_s"] / measured["long_running"]["step_s"]
        rounds.append(measured)
        print(json.dumps({"round": r, **measured}), flush=True)
    summary = {
        name: {key: statistics.median(m[name][key] for m in rounds) for key in ("step_s", "rollout_s", "agent_starts")}
        for name in VARIANTS
    }
    ratios = [m["ratio"] for m in rounds]
    run.write({"rounds": rounds, "summary": summary, "ratios": ratios}, out / "summary.json")
    print("| variant | step s (median of rounds) | rollout s | agent programs started |")
    print("|---|---|---|---|")
    for name, m in summary.items():
        print(f"| {name} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | {m['agent_starts']:.0f} |")
    print(f"\nper_episode / long_running step time: {', '.join(f'{x:.1f}x' for x in ratios)} "
          f"(median {statistics.median(ratios):.1f}x)")  # fmt: skip
    print(run.footer())


if __name__ == "__main__":
    main()
