"""One rollout step under FSDP2 on N ranks, each rank fed its own group of the handmade batch; rank 0 saves the
full updated weights, and each rank its optimiser-step count to ``OUT.rank<r>``.

    python -m roll_lightning.checks.fsdp_worker MODEL_DIR OUT ALGORITHM_JSON [--ranks N] [--nodes M]
        [--backend gloo|nccl] [--accelerator cpu|gpu] [--rank1-rows K] [--turns T] [--groups G]
        [--save CKPT] [--resume CKPT]

Its own process, since Lightning starts the other ranks by rerunning the command. ``--rank1-rows K``: rank 1
gets only K rows; ``--turns T``: trajectory rows of T turns each. ``--nodes M``: started once per node with
``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` set. ``--groups G``: the batch has G groups, rank r trains groups
r, r+N, ...; ``--save CKPT``: write the trainer's (sharded) checkpoint after the step; ``--resume CKPT``: start from
one, written on any number of ranks, and take one step more.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from roll_lightning.checks.handmade import Repeat, handmade_batch
from roll_lightning.exits import close_process_group
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.training import AlgorithmConfig, OptimConfig
from roll_lightning.training.module import AgentRLModule


class RankShard(L.LightningDataModule):
    """Rank r gets the rows of groups r, r + ranks, ... (whole groups, as the rollout guarantees)."""

    def __init__(self, batch: RolloutBatch, rank1_rows: int | None = None) -> None:
        super().__init__()
        self.batch = batch
        self.rank1_rows = rank1_rows

    def train_dataloader(self) -> Any:
        rank, ranks = self.trainer.global_rank, self.trainer.world_size
        mine = set(sorted(set(self.batch.traj_group_id))[rank::ranks])
        rows = [i for i, g in enumerate(self.batch.traj_group_id) if g in mine]
        if rank == 1 and self.rank1_rows is not None:
            rows = rows[: self.rank1_rows]
        return torch.utils.data.DataLoader(Repeat(self.batch.select(rows)), batch_size=None)


def main() -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("algorithm_json")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--backend", default="gloo")
    ap.add_argument("--accelerator", default="cpu")
    ap.add_argument("--rank1-rows", type=int, default=None)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--groups", type=int, default=None)
    ap.add_argument("--save", default=None)
    ap.add_argument("--resume", default=None)
    args = ap.parse_args()
    model_dir = args.model_dir
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = handmade_batch(Path(model_dir), tokenizer, groups=args.groups or args.ranks, turns=args.turns)
    module = AgentRLModule(
        model_dir,
        algorithm=AlgorithmConfig(**json.loads(args.algorithm_json)),
        optim=OptimConfig(lr=1e-3),
        rollout_steps=2 if args.resume else 1,
    )
    strategy = ModelParallelStrategy(
        data_parallel_size=args.ranks, tensor_parallel_size=1, process_group_backend=args.backend
    )
    trainer = L.Trainer(
        default_root_dir=Path(args.out).parent,
        accelerator=args.accelerator,
        devices=args.ranks // args.nodes,
        num_nodes=args.nodes,
        strategy=strategy,
        max_steps=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=RankShard(batch, args.rank1_rows), ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    Path(f"{args.out}.rank{trainer.global_rank}").write_text(str(trainer.global_step))
    state = get_model_state_dict(module.actor, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if trainer.global_rank == 0:
        torch.save(state, args.out)
    close_process_group()


if __name__ == "__main__":
    main()
