"""`bench/seeds.py`, the main command over seeds (issue 46): a short round of two seeds of the recipe and one
variant beside it, two at a time, runs to a summary and a report; the report reads again from that summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.cli import ROOT, cli_env


def test_two_seeds_and_a_variant_run_to_a_report_that_reads_again(tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    bench = [sys.executable, str(ROOT / "bench" / "seeds.py")]
    done = subprocess.run(
        [*bench, "--steps", "4", "--eval-every", "2", "--seeds", "0", "1", "--parallel", "2",
         "--variant", "beta2=--model.optim.betas [0.9,0.99]", "--out", str(out),
         "--", "--data.evaluation.episodes", "8"],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    summary = json.loads((out / "summary.json").read_text())
    runs = {(r["variant"], r["seed"]): r for r in summary["results"]}
    assert sorted(runs) == [("beta2", 0), ("beta2", 1), ("recipe", 0), ("recipe", 1)]
    for (variant, seed), run in runs.items():
        assert [e["step"] for e in run["evals"]] == [0, 2, 4], (variant, seed, run["evals"])
        assert f"--seed_everything {seed}" in run["command"]
        assert ("--model.optim.betas" in run["command"]) == (variant == "beta2")
    for variant in ("recipe", "beta2"):  # each table's rows are its runs' evaluations, seed by seed
        cells = " | ".join(f"{runs[variant, seed]['evals'][-1]['success']:.1%}" for seed in (0, 1))
        assert f"| end | {cells} |" in done.stdout, (variant, cells)
        assert f"**{variant}** (2 seeds: 0, 1;" in done.stdout
    for row in ("| step 0 |", "| bursts (batches) / far updates |"):
        assert row in done.stdout, row
    again = subprocess.run(
        [*bench, "--from-summary", str(out / "summary.json")],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.strip() and again.stdout.strip() in done.stdout  # the same tables, read back
