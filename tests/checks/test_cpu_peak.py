"""`bench/cpu_peak.py --quick` (issue 52): the matmul peak in float32 and bfloat16 and one short `fit` of the
tiny-words recipe through the project's trainer, its training and generation shares of the peak, and the top ops
of one profiled update, all recorded like the other benchmarks (command, commit, load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.cli import ROOT, cli_env


def test_the_quick_run_measures_the_peak_and_a_recipes_share(tmp_path: Path) -> None:
    out = tmp_path / "cpu_peak.json"
    done = subprocess.run(
        [sys.executable, "bench/cpu_peak.py", "--quick", "--out", str(out)],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["command"].endswith("bench/cpu_peak.py --quick --out " + str(out))
    assert {"load_start", "load_end", "cpu_model", "threads"} <= set(record["machine"])
    for dtype in ("float32", "bfloat16"):
        assert record["peaks"][dtype]["peak_flops"] > 1e8, record["peaks"]
    (recipe,) = record["recipes"].values()
    assert recipe["shape"]["model_dtype"] == "float32" and recipe["steps_timed"] >= 1
    # no upper bound: on a loaded machine the peak (2 OpenMP threads, one core busy) can fall below the step's rate
    assert recipe["train_tokens_per_s"] > 0 and recipe["train_share"] > 0, recipe
    peak = record["peaks"]["float32"]["peak_flops"]
    assert abs(recipe["train_flops"] / peak - recipe["train_share"]) < 1e-9 * recipe["train_share"], recipe
    assert 0 < recipe["gen_share"] < recipe["engine_share_with_prefill"], recipe  # prompts are most of its work
    assert recipe["top_ops"] and all(op["self_s"] > 0 for op in recipe["top_ops"])
    assert "| training (update" in done.stdout and "share of peak" in done.stdout
