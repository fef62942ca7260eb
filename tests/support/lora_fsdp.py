"""Run by tests/training/test_lora.py as ``python support/lora_fsdp.py MODEL_DIR ROOT LORA_JSON``: LoRA under
FSDP2 on 2 CPU ranks (gloo, `ModelParallelStrategy`, full-file checkpoints), the same batch on both ranks: two
rollout steps straight, and one step then ``--ckpt_path last`` resumed to two. Rank 0 saves both actors' full
weights to ROOT/straight.pt and ROOT/resumed.pt. Multi-process tests run as a subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from roll_lightning.checkpoints import StepCheckpoint, resolve_ckpt_path, use_checksummed_io
from roll_lightning.checks.handmade import FixedBatches, handmade_batch
from roll_lightning.training import LoraConfig, OptimConfig
from roll_lightning.training.module import AgentRLModule


def fit(model_dir: str, root: Path, lora: LoraConfig, steps: int, batch: object, resume: bool = False) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo", save_distributed_checkpoint=False
    )
    trainer = use_checksummed_io(
        L.Trainer(
            accelerator="cpu", devices=2, strategy=strategy, default_root_dir=root, logger=False, max_steps=-1,
            max_epochs=-1, callbacks=[StepCheckpoint()], enable_progress_bar=False, enable_model_summary=False,
        )
    )  # fmt: skip
    module = AgentRLModule(model_dir, optim=OptimConfig(lr=1e-3), lora=lora, rollout_steps=steps)
    path = resolve_ckpt_path("last", trainer, fitting=True) if resume else None
    trainer.fit(module, datamodule=FixedBatches(batch), ckpt_path=path)
    return trainer, module


def main(model_dir: str, root: str, lora_json: str) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    batch = handmade_batch(Path(model_dir), AutoTokenizer.from_pretrained(model_dir))
    lora = LoraConfig(**json.loads(lora_json))
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for name, steps in (("straight", [2]), ("resumed", [1, 2])):
        for i, n in enumerate(steps):
            trainer, module = fit(model_dir, Path(root) / name, lora, n, batch, resume=i > 0)
        state = get_model_state_dict(module.actor, options=options)
        if trainer.global_rank == 0:
            torch.save(state, Path(root) / f"{name}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
