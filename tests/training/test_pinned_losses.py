"""Pinned per-step numbers, as torchtune pins its recipes' losses: the first three rollout steps' ``train/loss``,
``train/grad_norm`` and ``train/advantage_mean`` of each estimator on the deterministic hand-made batch
(tiny model, seed 0, float32, one thread). A refactor that changes what the trainer computes fails here loudly;
a change that is meant to move them updates the table in the same commit, saying why.

Two things are being checked at once. First, that the estimators, the loss assembly (`algorithms/objective.py`)
and the optimiser step still compute what they computed when the table was written. Second, through the
``ppo_epochs: 2, mini_batches: 2`` settings, that several optimiser steps per batch also give the same numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from support.trainers import quiet_trainer

from roll_lightning.checks.handmade import FixedBatches, handmade_batch
from roll_lightning.training import AlgorithmConfig, OptimConfig
from roll_lightning.training.module import AgentRLModule

KEYS = ("train/loss", "train/grad_norm", "train/advantage_mean")
SETTINGS = {  # estimator: (row layout, algorithm settings)
    "grpo": ("trajectory", {"estimator": "grpo"}),
    "gigpo": ("step", {"estimator": "gigpo"}),
    "ppo-gae": ("trajectory", {"estimator": "ppo-gae"}),
    "grpo-gspo-kl-entropy": ("trajectory", {"loss": "gspo", "kl_coef": 0.1, "entropy_coef": 0.01}),
}
PINNED: dict[str, list[tuple[float, float, float]]] = {  # (train/loss, train/grad_norm, train/advantage_mean)
    "grpo": [
        (-0.022687675431370735, 2.092045783996582, 0.0),
        (-0.012620278634130955, 2.209110975265503, 0.0),
        (-0.012516193091869354, 2.9210634231567383, 0.0),
    ],
    "gigpo": [
        (-0.04537534713745117, 4.184091567993164, 0.0),
        (-0.025240488350391388, 4.418221950531006, 0.0),
        (-0.025032490491867065, 5.842126846313477, 0.0),
    ],
    "ppo-gae": [
        (-0.4017075002193451, 2.553419589996338, 0.4309467375278473),
        (-0.18078914284706116, 1.5600782632827759, 0.21943359076976776),
        (-0.009477034211158752, 1.535855770111084, 0.05179240182042122),
    ],
    "grpo-gspo-kl-entropy": [
        (-0.06230388581752777, 0.4483511745929718, 0.0),
        (-0.05793263763189316, 2.416337728500366, 0.0),
        (-0.060851939022541046, 0.7733503580093384, 0.0),
    ],
}


class Record(L.Callback):
    def __init__(self) -> None:
        self.steps: list[tuple[float, ...]] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.steps.append(tuple(float(trainer.callback_metrics[k]) for k in KEYS))


def three_steps(model_dir: Path, tokenizer: Any, tmp_path: Path, name: str) -> list[tuple[float, ...]]:
    layout, settings = SETTINGS[name]
    batch = handmade_batch(model_dir, tokenizer, layout=layout)
    algorithm = AlgorithmConfig(**settings, ppo_epochs=2, mini_batches=2, recompute_old_logprobs=True)
    module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-4), seed=0)
    module.rollout_steps_limit = 3
    record = Record()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        quiet_trainer(tmp_path, max_steps=-1, callbacks=[record]).fit(module, datamodule=FixedBatches(batch))
    finally:
        torch.set_num_threads(threads)
    return record.steps


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_first_three_steps_are_the_pinned_numbers(
    model_dir: Path, tokenizer: Any, tmp_path: Path, name: str
) -> None:
    steps = three_steps(model_dir, tokenizer, tmp_path, name)
    assert len(steps) == 3
    for step, (got, pinned) in enumerate(zip(steps, PINNED[name], strict=True), start=1):
        for key, a, b in zip(KEYS, got, pinned, strict=True):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-7), f"{name} step {step} {key}: {a!r}, pinned {b!r}"
