"""A data module that feeds the same rollout batch every step: for training tests where the rollout is not
under test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from roll_lightning.rollout.batch import RolloutBatch


class Repeat(torch.utils.data.IterableDataset):
    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch

    def __iter__(self) -> Iterator[RolloutBatch]:
        while True:
            yield self.batch


class FixedBatches(L.LightningDataModule):
    def __init__(self, batch: RolloutBatch) -> None:
        super().__init__()
        self.batch = batch

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(Repeat(self.batch), batch_size=None)
