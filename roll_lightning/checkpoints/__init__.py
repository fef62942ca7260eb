"""Checkpoints that resume where a run stopped and are never used damaged (docs/reliability.md)."""

from roll_lightning.checkpoints.callback import LAST, PREVIOUS, StepCheckpoint, checkpoint_dir, held_rollout_step
from roll_lightning.checkpoints.integrity import CheckpointError, Stamp, read_stamp, verify, write_checkpoint
from roll_lightning.checkpoints.io import ChecksummedCheckpointIO, use_checksummed_io
from roll_lightning.checkpoints.lightning_fixes import apply as _apply_lightning_fixes
from roll_lightning.checkpoints.resume import resolve_ckpt_path

_apply_lightning_fixes()

__all__ = [
    "LAST",
    "PREVIOUS",
    "CheckpointError",
    "ChecksummedCheckpointIO",
    "Stamp",
    "StepCheckpoint",
    "checkpoint_dir",
    "held_rollout_step",
    "read_stamp",
    "resolve_ckpt_path",
    "use_checksummed_io",
    "verify",
    "write_checkpoint",
]
