"""`StepCheckpoint`: ``last.ckpt`` after every rollout step, and ``previous.ckpt``, the step before it.

The folder is ``<default_root_dir>/checkpoints`` whatever the logger: Lightning's per-version folder changes on
resume, so ``--ckpt_path last`` would find nothing. One file per step, so a kill cannot leave two out of step.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from roll_lightning.checkpoints.integrity import temporary_path

CHECKPOINTS = "checkpoints"
PREVIOUS = "previous.ckpt"


def checkpoint_dir(trainer: L.Trainer) -> Path:
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, StepCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath)
    return Path(os.path.realpath(trainer.default_root_dir)) / CHECKPOINTS


class StepCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every_n_train_steps`` optimiser steps (1: every rollout step); nothing else kept."""

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int = 1) -> None:
        super().__init__(
            dirpath=dirpath,
            save_last=True,
            save_top_k=0,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,  # always `last.ckpt`, never `last-v1.ckpt`
        )
        self._wrote_last = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(checkpoint_dir(trainer))
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and Path(self.dirpath).is_dir():
            for stale in Path(self.dirpath).glob(".*.tmp"):  # left by a killed write
                stale.unlink(missing_ok=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # saving the state after the step's updates is what a resumed run needs
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        last = Path(self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST))
        if self.save_last and trainer.is_global_zero:
            if self._known_good(trainer, last):
                keep_as_previous(last)
            elif last.is_dir():  # sharded folders are written in place: never into a maybe partial one
                shutil.rmtree(last)
        if trainer.world_size > 1:  # every rank writes a sharded `last`: not before rank 0 moved it away
            trainer.strategy.barrier("StepCheckpoint.keep_as_previous")
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._wrote_last = True

    def _known_good(self, trainer: L.Trainer, last: Path) -> bool:
        """``last`` is this run's write or its verified resume point, so a damaged one never replaces previous."""
        resumed_from = trainer.ckpt_path
        return self._wrote_last or (resumed_from is not None and Path(resumed_from).resolve() == last.resolve())


def keep_as_previous(last: Path) -> None:
    """Make ``previous.ckpt`` the current ``last``: a file by hard link and rename, a sharded folder by a move."""
    previous = last.with_name(PREVIOUS)
    if last.is_dir():
        if previous.is_dir():
            shutil.rmtree(previous)
        elif previous.exists():
            previous.unlink()
        os.replace(last, previous)
        return
    if not last.is_file():
        return
    temporary = temporary_path(previous)
    temporary.unlink(missing_ok=True)
    try:
        os.link(last, temporary)
    except OSError:  # no hard links
        shutil.copyfile(last, temporary)
    os.replace(temporary, previous)
