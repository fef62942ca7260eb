"""It learns: the CPU recipe (`configs/frozenlake_learn.yaml`), shortened, lifts held-out FrozenLake success.

The full recipe is 15 minutes per estimator (bench/learning_curve.py, docs/benchmarks.md). Here GRPO runs 400
rollout steps (a few minutes on 2 cores) with fixed seeds, evaluating 128 held-out maps before the first update
and at the end. The rollout is not bit-reproducible (the engine batches whatever requests are waiting, so the
random draws land differently), hence margins, not golden values: in the benchmark runs the policy was at +30
and +50 points at this step count, while a policy that only learned to answer validly gains about +12.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
STEPS = 400


def test_the_cpu_recipe_learns_frozenlake(tmp_path: Path) -> None:
    env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable, "-m", "roll_lightning", "fit", "--config", str(ROOT / "configs" / "frozenlake_learn.yaml"),
            "--model.rollout_steps", str(STEPS), "--trainer.val_check_interval", str(STEPS),
            "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    evals = [(int(r["step"]), float(r["rollout/eval_success_rate"])) for r in rows if r["rollout/eval_success_rate"]]
    assert [step for step, _ in evals] == [0, STEPS - 1]  # before any update, and after the last one
    (_, before), (_, after) = evals
    assert after - before >= 0.20, evals
    train = [r for r in rows if r["rollout/success_rate"]]
    assert len(train) == STEPS

    def mean(key: str, part: list[dict[str, str]]) -> float:
        return sum(float(r[key]) for r in part) / len(part)

    first, last = train[:50], train[-50:]
    assert mean("rollout/invalid_action_rate", last) < 0.05 < mean("rollout/invalid_action_rate", first)
    assert mean("rollout/success_rate", last) >= mean("rollout/success_rate", first) + 0.15
