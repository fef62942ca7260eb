"""Dynamic sampling through the CLI: two FSDP2 ranks whose batches filter differently still step together."""

from __future__ import annotations

import csv
from pathlib import Path

import torch
from support.cli import ROOT, TWO_RANKS, run_cli

STEPS = 4


def test_two_ranks_that_filter_differently_take_the_same_steps(tmp_path: Path) -> None:
    """The learning recipe's model on step rows, 2 ranks, a filter with a coarse tolerance (groups differing only by
    format penalties count as flat) and refills: each rank keeps and refills different groups and ends with a
    different row count, so without aligned steps and micro-batches the ranks' FSDP2 collectives would wait on
    each other forever. 16-row micro-batches make the micro-batch counts differ whenever the row counts do. The
    default ``batch_adjust: none`` (uneven mini-batches); the other modes at 2 ranks: tests/training/test_fsdp.py."""
    run = tmp_path / "run"
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "frozenlake_learn.yaml"), *TWO_RANKS,
        "--trainer.default_root_dir", str(run), "--data.evaluation.during_fit", "false",
        "--data.evaluation.at_fit_start", "false",
        "--data.rollout.group_filter.kind", "zero_variance", "--data.rollout.group_filter.tolerance", "0.5",
        "--data.rollout.group_filter.max_extra_groups", "2",
        "--model.algorithm.micro_batching", "fixed",
        "--model.algorithm.micro_batch_size", "16",
        cwd=tmp_path, timeout=540, ROLL_STEPS=str(STEPS),  # a hang guard: a deadlock fails here
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=False)  # FSDP2: a folder
    assert checkpoint["rollout_steps"] == STEPS and checkpoint["global_step"] == STEPS * 2  # mini_batches: 2
    rows = list(csv.DictReader(next(run.rglob("metrics.csv")).open()))
    filtered = [float(r["rollout/groups_filtered"]) for r in rows if r.get("rollout/groups_filtered")]
    assert len(filtered) == STEPS and sum(filtered) > 0, "the filter rejected groups (rank 0's are logged)"
