"""`ChecksummedCheckpointIO`: Lightning's checkpoint plugin, with atomic, checksummed writes verified on load.

Sharded checkpoints (folders `ModelParallelStrategy` writes itself) and remote paths bypass it.
"""

from __future__ import annotations

import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

from roll_lightning.checkpoints.integrity import CheckpointError, describe_intact_sibling, verify, write_checkpoint


class ChecksummedCheckpointIO(TorchCheckpointIO):
    """Writes each checkpoint as a whole or not at all, with its SHA-256 inside; loads only what verifies."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        existed = target.is_file()
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_checkpoint(checkpoint, target)
        except (OSError, RuntimeError) as err:  # a full disk, a read-only folder, ...
            before = "the one there before is unchanged" if existed else "there was none before"
            raise CheckpointError(
                f"checkpoint {target} could not be written ({_reason(err, target.parent)}); nothing partial was "
                f"left, and {before}"
            ) from err

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable[..., Any] | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        if not _is_local_file_protocol(path):
            return super().load_checkpoint(path, map_location, weights_only)
        verify(Path(path))
        try:
            checkpoint = super().load_checkpoint(path, map_location, weights_only)
        except Exception as err:  # an unstamped file torch rejects
            detail = "its pickled data is not readable" if isinstance(err, pickle.UnpicklingError) else str(err)
            first_line = detail.strip().splitlines()[0] if detail.strip() else type(err).__name__
            raise CheckpointError(
                f"checkpoint {path} cannot be loaded ({first_line}); {describe_intact_sibling(Path(path))}"
            ) from err
        missing = [key for key in LIGHTNING_KEYS if not isinstance(checkpoint, dict) or key not in checkpoint]
        if missing:  # Lightning would fail with a KeyError
            held = (
                ", ".join(map(str, list(checkpoint)[:6])) if isinstance(checkpoint, dict) else type(checkpoint).__name__
            )
            raise CheckpointError(
                f"checkpoint {path} is not a Lightning checkpoint of this trainer (no {missing[0]!r}; it holds: "
                f"{held or 'nothing'}); {describe_intact_sibling(Path(path))}"
            )
        return checkpoint


LIGHTNING_KEYS = ("pytorch-lightning_version", "global_step", "state_dict")


def _reason(err: OSError | RuntimeError, folder: Path) -> str:
    """Why a write failed, with the free space: torch reports a full disk as "iostream error", without errno."""
    if isinstance(err, OSError):
        return str(err.strerror or err)
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    try:
        free = f"; {shutil.disk_usage(folder).free / 2**20:.0f} MiB free on its disk"
    except OSError:
        free = ""
    return f"torch.save failed: {first_line}{free}"


def use_checksummed_io(trainer: L.Trainer) -> L.Trainer:
    """Give ``trainer``'s strategy a `ChecksummedCheckpointIO`, unless it has a plugin of its own."""
    strategy = trainer.strategy
    if type(strategy.checkpoint_io) is TorchCheckpointIO:
        strategy.checkpoint_io = ChecksummedCheckpointIO()
    return trainer
