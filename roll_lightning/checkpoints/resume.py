"""`resolve_ckpt_path`: what ``--ckpt_path`` means for a run, decided before any server or model starts.

The rules: docs/reliability.md, "Resume".
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only

from roll_lightning.checkpoints.callback import LAST, checkpoint_dir
from roll_lightning.checkpoints.integrity import CheckpointError, describe_intact_sibling, read_stamp, verify

SHARDED_COMPLETE = "meta.pt"  # written after every rank's shards
PASS_THROUGH = ("best", "hpc")


def resolve_ckpt_path(requested: str | None, trainer: L.Trainer, fitting: bool) -> str | None:
    """The checkpoint to start from (None: none); `CheckpointError` when there is none to use."""
    directory = checkpoint_dir(trainer)
    if requested is None:
        if fitting:
            _refuse_to_overwrite(directory)
        return None
    if requested == "last":
        resolved = _resolve_last(directory, Path(trainer.default_root_dir), fitting)
    elif requested in PASS_THROUGH or "://" in requested or requested.startswith("registry:"):
        return requested
    else:
        _check(Path(requested))
        resolved = requested
    if resolved is not None and Path(resolved).is_dir():
        _check_reads_folders(Path(resolved), trainer)
    return resolved


def _check_reads_folders(path: Path, trainer: L.Trainer) -> None:
    """A sharded checkpoint (a folder) needs a sharded strategy to read it, on any number of ranks."""
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, (ModelParallelStrategy, FSDPStrategy)):
        raise CheckpointError(
            f"checkpoint {path} is a sharded folder, which {type(strategy).__name__} cannot read: resume with "
            "--trainer.strategy lightning.pytorch.strategies.ModelParallelStrategy (on any number of devices, e.g. "
            "--trainer.strategy.data_parallel_size 1 --trainer.devices 1), as configs/cpu_two_ranks.yaml sets it"
        )


def _check(path: Path) -> None:
    if not path.is_dir():
        verify(path)
    elif not (path / SHARDED_COMPLETE).is_file():
        raise CheckpointError(
            f"checkpoint {path} is incomplete: a sharded checkpoint folder without {SHARDED_COMPLETE} (its write "
            f"was interrupted); {describe_intact_sibling(path)}"
        )


def _resolve_last(directory: Path, root: Path, fitting: bool) -> str | None:
    last = directory / LAST
    if last.exists():
        _check(last)
        return str(last)
    others = [p for p in root.rglob("*.ckpt")] if root.is_dir() else []
    if others:
        newest = max(others, key=lambda p: p.stat().st_mtime)
        raise CheckpointError(
            f"--ckpt_path last: {directory} has no {LAST}, but {root} holds {len(others)} other checkpoint(s), the "
            f"newest {newest}: resume from it with --ckpt_path {newest}, or start anew in another "
            "--trainer.default_root_dir"
        )
    if not fitting:
        raise CheckpointError(f"--ckpt_path last: there is no checkpoint in {directory} to evaluate")
    _notice(f"--ckpt_path last: no checkpoint in {directory} yet; starting a new run at step 0")
    return None


def _refuse_to_overwrite(directory: Path) -> None:
    existing = sorted(directory.glob("*.ckpt")) if directory.is_dir() else []
    if not existing:
        return
    stamp = read_stamp(directory / LAST)
    held = f" ({LAST}: {stamp.describe()})" if stamp is not None else ""
    raise CheckpointError(
        f"{directory} holds the checkpoints of an earlier run{held}, which a new run would overwrite: resume it "
        "with --ckpt_path last, or start a new run in another --trainer.default_root_dir"
    )


@rank_zero_only
def _notice(message: str) -> None:
    print(f"roll_lightning: {message}", file=sys.stderr, flush=True)
