"""Run by tests/training/test_fsdp.py as ``python support/fsdp_update.py MODEL_DIR OUT_FILE ALGORITHM_JSON
[RANK1_ROWS]``: one rollout step under FSDP2 on 2 CPU ranks (gloo, `ModelParallelStrategy`), each rank fed its own
group of the handmade batch (rank 1 only its first RANK1_ROWS rows, if given: ranks with different row counts);
rank 0 saves the full updated weights, and each rank its optimiser-step count to OUT_FILE.rank<r>.
Multi-process tests run as a subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from roll_lightning.checks.handmade import Repeat, handmade_batch
from roll_lightning.module import AgentRLModule
from roll_lightning.rollout.batch import RolloutBatch
from roll_lightning.training import AlgorithmConfig, OptimConfig
from support.trainers import quiet_trainer


class RankShard(L.LightningDataModule):
    """Rank r gets the rows of group r (each rank holds whole groups, as the rollout guarantees)."""

    def __init__(self, batch: RolloutBatch, rank1_rows: int | None = None) -> None:
        super().__init__()
        self.batch = batch
        self.rank1_rows = rank1_rows

    def train_dataloader(self) -> Any:
        rank = self.trainer.global_rank
        group = sorted(set(self.batch.traj_group_id))[rank]
        rows = [i for i, g in enumerate(self.batch.traj_group_id) if g == group]
        if rank == 1 and self.rank1_rows is not None:
            rows = rows[: self.rank1_rows]
        return torch.utils.data.DataLoader(Repeat(self.batch.select(rows)), batch_size=None)


def main(model_dir: str, out_file: str, algorithm_json: str, rank1_rows: str | None = None) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    batch = handmade_batch(Path(model_dir), AutoTokenizer.from_pretrained(model_dir))
    module = AgentRLModule(
        model_dir, algorithm=AlgorithmConfig(**json.loads(algorithm_json)), optim=OptimConfig(lr=1e-3), rollout_steps=1
    )
    trainer = quiet_trainer(
        Path(out_file).parent,
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo"),
        max_steps=-1,
    )
    trainer.fit(module, datamodule=RankShard(batch, int(rank1_rows) if rank1_rows else None))
    Path(f"{out_file}.rank{trainer.global_rank}").write_text(str(trainer.global_step))
    state = get_model_state_dict(module.actor, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.global_rank == 0:
        torch.save(state, out_file)


if __name__ == "__main__":
    main(*sys.argv[1:5])
