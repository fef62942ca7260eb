"""`StepCheckpoint`: ``last.ckpt`` after every rollout step, and ``previous.ckpt``, the step before it.

The folder is ``<default_root_dir>/checkpoints`` whatever the logger: Lightning's per-version folder changes on
resume, so ``--ckpt_path last`` would find nothing. One file per step, so a kill cannot leave two out of step.
However a fit ends (``model.rollout_steps``, ``trainer.max_time``, a signal, an env outage), ``last.ckpt`` holds
its last finished step, whatever ``every_n_train_steps`` says, and a step that is evaluated holds its evaluation.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from roll_lightning.checkpoints.integrity import read_stamp, temporary_path

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"
PREVIOUS = "previous.ckpt"


def checkpoint_dir(trainer: L.Trainer) -> Path:
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, StepCheckpoint) and callback.dirpath is not None:
            return Path(callback.dirpath)
    return Path(os.path.realpath(trainer.default_root_dir)) / CHECKPOINTS


class StepCheckpoint(ModelCheckpoint):
    """``last.ckpt`` every ``every_n_train_steps`` optimiser steps (1: every rollout step), at the end of a fit and
    when it stops between steps; nothing else kept.

    A stop is saved only where it is known to come between steps on every rank: a rollout's stop or failure (all
    ranks raise it together, after the world stop's agreement, so all join the sharded save, a collective), or, on
    one rank, Lightning's `SIGTERMException`. Any other error may have cut an update short, or left a rank out of
    the collective: then ``last.ckpt`` keeps the last step it was written at.
    """

    def __init__(self, dirpath: str | None = None, every_n_train_steps: int = 1) -> None:
        super().__init__(
            dirpath=dirpath,
            save_last=True,
            save_top_k=0,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,  # always `last.ckpt`, never `last-v1.ckpt`
        )
        self._wrote_last = False
        self._held: int | None = None  # the rollout step `last.ckpt` holds, as far as this run knows
        self._training = False
        self._before_evaluation = False  # `last.ckpt` holds this step, written before its evaluation ran

    @property
    def held_step(self) -> int | None:
        """The rollout step ``last.ckpt`` holds: the one this fit wrote or resumed from (None: neither)."""
        return self._held

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            self.dirpath = str(checkpoint_dir(trainer))
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and Path(self.dirpath).is_dir():
            for stale in Path(self.dirpath).glob(".*.tmp"):  # left by a killed write
                stale.unlink(missing_ok=True)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        resumed = _resumed_from(trainer, Path(self.dirpath or checkpoint_dir(trainer)) / LAST)
        self._held = _rollout_steps(trainer, pl_module) if resumed else None
        self._training, self._before_evaluation = True, False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # saving the state after the step's updates is what a resumed run needs
            warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization")
            super().on_train_batch_end(trainer, pl_module, *args, **kwargs)
        if trainer.should_stop:  # the last step (`model.rollout_steps`, `trainer.max_time`), saved inside its epoch
            self._save_if_behind(trainer, pl_module)  # as every other step is, so a resume keeps the loops' counts
        self._before_evaluation = self._held == _rollout_steps(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Write this step again when it was written before its evaluation, so a resume shows the evaluation."""
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking and self._before_evaluation:
            self._before_evaluation = False
            if self._held == _rollout_steps(trainer, pl_module):
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The last step, if the stop came after its batch ended (e.g. ``max_time`` reached during an evaluation)."""
        self._save_if_behind(trainer, pl_module)
        self._training = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """The last finished step, when the fit stopped between steps on every rank (the class docstring);
        idempotent, so `RunSummary` may call it first. A failed write is reported, never raised over the stop."""
        if not self._training or not _stopped_between_steps(trainer, exception):
            return
        try:
            self._save_if_behind(trainer, pl_module)
        except Exception as err:
            rank_zero_warn(f"the checkpoint of the stop was not written ({err}); {LAST} holds step {self._held}")
        finally:
            self._training = False

    def _save_if_behind(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        steps = _rollout_steps(trainer, pl_module)
        if trainer.state.fn == TrainerFn.FITTING and steps > 0 and steps != self._held:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        last = Path(self.format_checkpoint_name(monitor_candidates, self.CHECKPOINT_NAME_LAST))
        steps = _rollout_steps(trainer, trainer.lightning_module)
        if self.save_last and trainer.is_global_zero:
            if self._wrote_last and self._held == steps and last.is_file():
                pass  # the same step again (with its evaluation): replaced by rename, previous stays the step before
            elif self._known_good(trainer, last):
                keep_as_previous(last)
            elif last.is_dir():  # sharded folders are written in place: never into a maybe partial one
                shutil.rmtree(last)
        if trainer.world_size > 1:  # every rank writes a sharded `last`: not before rank 0 moved it away
            trainer.strategy.barrier("StepCheckpoint.keep_as_previous")
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._wrote_last, self._held = True, steps

    def _known_good(self, trainer: L.Trainer, last: Path) -> bool:
        """``last`` is this run's write or its verified resume point, so a damaged one never replaces previous."""
        return self._wrote_last or _resumed_from(trainer, last)


def _resumed_from(trainer: L.Trainer, last: Path) -> bool:
    """Whether this fit resumed from ``last``."""
    return trainer.ckpt_path is not None and Path(trainer.ckpt_path).resolve() == last.resolve()


def _rollout_steps(trainer: L.Trainer, pl_module: L.LightningModule) -> int:
    """The rollout steps trained (`AgentRLModule.steps_done`), else the optimiser steps."""
    return int(getattr(pl_module, "steps_done", trainer.global_step))


def _stopped_between_steps(trainer: L.Trainer, exception: BaseException) -> bool:
    """Whether every rank stopped between steps: the rollout raised the stop on all at once
    (`RolloutDataModule.stopped_together`), or one rank's Lightning loop raised `SIGTERMException` between steps
    (a plain `SystemExit` may land inside an update)."""
    if getattr(trainer.datamodule, "stopped_together", False):
        return True
    return trainer.world_size == 1 and isinstance(exception, SIGTERMException)


def held_rollout_step(trainer: L.Trainer, last: Path) -> int | None:
    """The rollout step ``last`` holds: as this run's `StepCheckpoint` wrote it, else from the file's stamp (its zip
    comment: no need to load it); None when neither says."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, StepCheckpoint) and callback.held_step is not None:
            return callback.held_step
    stamp = read_stamp(last) if last.is_file() else None
    return stamp.rollout_step if stamp is not None else None


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
