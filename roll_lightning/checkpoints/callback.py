"""`StepCheckpoint`: ``last.ckpt`` after every rollout step, in ``<default_root_dir>/checkpoints`` whatever the
logger, and ``previous.ckpt``, the step before it.

Why a fixed folder: Lightning puts checkpoints under the logger's ``<name>/version_N/checkpoints``, and a new run
gets a new version, so ``--ckpt_path last`` looked in ``version_N+1``, found nothing and trained from step 0 again
(every shipped config has a logger). Pinning the folder to the run's root is one rule for every logger, none
included; logs still start a new version on resume, checkpoints carry on in the same place.

Why one file per step, not Lightning's ``epoch=…-step=…`` plus ``last.ckpt``: those are two writes, and a kill
between them left ``last`` a step behind its sibling. Here ``last.ckpt`` is the only file a step writes (through
`ChecksummedCheckpointIO`: atomic, checksummed), so it is always the newest complete step; just before it is
replaced, the old one is kept as ``previous.ckpt`` (a hard link: no copy, and itself an atomic rename), the
intact fallback a damaged ``last`` is reported with. A sharded checkpoint (`ModelParallelStrategy`'s default, a
folder every rank writes into) is moved to ``previous.ckpt`` before the next is written; Lightning writes its
``meta.pt`` last, so a folder without one is incomplete (`resolve_ckpt_path` says so).
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
    """The folder the run's `StepCheckpoint` writes to (``<default_root_dir>/checkpoints`` unless set)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, StepCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath)
    return Path(os.path.realpath(trainer.default_root_dir)) / CHECKPOINTS


class StepCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every_n_train_steps`` optimiser steps (a rollout step is a whole number of them,
    so 1 is every rollout step), the one before as ``previous.ckpt``; nothing else is kept."""

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
            for stale in Path(self.dirpath).glob(".*.tmp"):  # what a write killed midway left
                stale.unlink(missing_ok=True)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # Lightning warns that with manual optimisation it saves the state after the step's updates, not the
            # one before: after is what a resumed run needs (the next step starts from it)
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        last = Path(self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST))
        if self.save_last and trainer.is_global_zero:
            if self._known_good(trainer, last):
                keep_as_previous(last)
            elif last.is_dir():  # a sharded folder is written in place: never into an unknown (maybe partial) one
                shutil.rmtree(last)
        if trainer.world_size > 1:  # a sharded `last` is written by every rank: not before rank 0 moved it away
            trainer.strategy.barrier("StepCheckpoint.keep_as_previous")
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._wrote_last = True

    def _known_good(self, trainer: L.Trainer, last: Path) -> bool:
        """Whether ``last`` is this run's own write or the file it resumed from (verified when loaded): a run
        resumed from ``previous.ckpt`` beside a damaged ``last.ckpt`` must not keep the damaged one over it."""
        resumed_from = trainer.ckpt_path
        return self._wrote_last or (resumed_from is not None and Path(resumed_from).resolve() == last.resolve())


def keep_as_previous(last: Path) -> None:
    """Make ``previous.ckpt`` the current ``last``: a file atomically (hard link, rename), a folder (a sharded
    checkpoint, written in place by every rank, so never whole until its ``meta.pt``) by moving it away."""
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
    except OSError:  # a filesystem without hard links
        shutil.copyfile(last, temporary)
    os.replace(temporary, previous)
