"""Run by test_datamodule.py as ``python support/two_rank_rollout.py MODEL_DIR OUT_DIR``: a 2-rank DDP (gloo) fit
whose module records the rollout groups each rank was fed. Multi-process tests run as a subprocess."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch

from roll_lightning.rollout import EpisodeSettings, RolloutConfig
from roll_lightning.rollout.datamodule import EnvsConfig, RolloutDataModule
from roll_lightning.rollout.engines import SamplingParams
from support.trainers import quiet_trainer


class Recorder(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.out = out
        self.groups: list[list[str]] = []

    def training_step(self, dataloader_iter: Iterator[Any]) -> None:
        batch, _, _ = next(dataloader_iter)
        self.groups.append(sorted(set(batch.traj_group_id)))
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1).pow(2).sum())  # DDP all-reduces this: the ranks step together
        opt.step()

    def on_train_end(self) -> None:
        (self.out / f"rank{self.global_rank}.json").write_text(json.dumps(self.groups))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(model_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))
    rollout = RolloutConfig(env_id="frozenlake", group_size=2, batch_size=4, episode=episode)
    dm = RolloutDataModule(model_dir, rollout=rollout, envs=EnvsConfig(endpoints="local"))
    trainer = quiet_trainer(out, max_steps=2, devices=2, strategy="ddp")
    trainer.fit(Recorder(out), datamodule=dm)


if __name__ == "__main__":
    main(*sys.argv[1:3])
