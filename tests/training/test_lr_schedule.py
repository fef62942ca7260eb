"""The learning-rate schedule: a cosine over ``total_steps`` rollout steps, or over the run itself (its rollout
steps or its ``trainer.max_time``, whichever ends first), so a timed run decays alike on a fast and a slow CPU."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import Timer
from support.trainers import quiet_trainer

from roll_lightning.checks.handmade import FixedBatches, handmade_batch
from roll_lightning.training import OptimConfig, TrainingConfigError
from roll_lightning.training.module import AgentRLModule

LR = 1e-4


def cosine(progress: float, floor: float = 0.1) -> float:
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class LrLog(L.Callback):
    """The learning rate each rollout step will use, read after the step."""

    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, *_: Any) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_the_cosine_follows_total_steps_or_the_runs_progress() -> None:
    fixed = OptimConfig(lr=LR, schedule="cosine", total_steps=10, min_lr_ratio=0.1)
    assert fixed.factor(5) == pytest.approx(cosine(0.5))
    assert fixed.factor(5, run_progress=0.9) == pytest.approx(cosine(0.5)), "total_steps wins when set"
    spans_run = OptimConfig(lr=LR, schedule="cosine", min_lr_ratio=0.1)
    assert spans_run.factor(5, run_progress=0.9) == pytest.approx(cosine(0.9))
    assert spans_run.factor(5, run_progress=1.7) == pytest.approx(0.1), "past the end: the floor"
    assert OptimConfig(lr=LR).factor(5, run_progress=0.9) == 1.0, "constant stays constant"


def test_a_run_without_total_steps_decays_over_its_rollout_steps(
    model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    module = AgentRLModule(str(model_dir), optim=OptimConfig(lr=LR, schedule="cosine", min_lr_ratio=0.1))
    module.rollout_steps_limit = 4
    log = LrLog()
    trainer = quiet_trainer(tmp_path, max_steps=-1, callbacks=[log])
    trainer.fit(module, datamodule=FixedBatches(handmade_batch(model_dir, tokenizer)))
    assert log.lrs == pytest.approx([LR * cosine(k / 4) for k in (1, 2, 3, 4)])


def test_a_timed_run_decays_over_its_time_budget(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Half of ``max_time`` already used (as after a resume): the first step's learning rate is the cosine's
    middle, though 2 of 1,000 rollout steps are done; the ranks agree on it (one rank here)."""
    module = AgentRLModule(str(model_dir), optim=OptimConfig(lr=LR, schedule="cosine", min_lr_ratio=0.1))
    module.rollout_steps_limit = 1000
    log = LrLog()
    trainer = quiet_trainer(tmp_path, max_steps=2, max_time={"minutes": 30}, callbacks=[log])
    timer = next(callback for callback in trainer.callbacks if isinstance(callback, Timer))
    timer.load_state_dict({"time_elapsed": {"train": 900.0}})
    trainer.fit(module, datamodule=FixedBatches(handmade_batch(model_dir, tokenizer)))
    assert len(log.lrs) == 2
    for lr in log.lrs:  # a step here takes well under a minute: progress 0.50-0.53
        assert LR * cosine(0.53) < lr <= LR * cosine(0.5)


def test_a_cosine_over_a_run_without_an_end_is_refused(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    module = AgentRLModule(str(model_dir), optim=OptimConfig(lr=LR, schedule="cosine"))
    trainer = quiet_trainer(tmp_path, max_steps=2)
    with pytest.raises(TrainingConfigError, match="model.optim.total_steps, model.rollout_steps or trainer.max_time"):
        trainer.fit(module, datamodule=FixedBatches(handmade_batch(model_dir, tokenizer)))
