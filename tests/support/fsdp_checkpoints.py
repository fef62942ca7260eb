"""Run by tests/checkpoints/test_checkpoints.py as ``python support/fsdp_checkpoints.py MODEL_DIR ROOT DISTRIBUTED``:
the CLI's checkpointing (`StepCheckpoint`, `ChecksummedCheckpointIO`) under FSDP2 on 2 CPU ranks (gloo,
`ModelParallelStrategy`): two rollout steps, then ``--ckpt_path last`` resolved and resumed to three.
``DISTRIBUTED`` is ``1`` for the strategy's default sharded checkpoints (folders), ``0`` for full files gathered
on rank 0. Rank 0 writes what it saw to ROOT/report.json. Multi-process tests run as a subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
from lightning.pytorch.strategies import ModelParallelStrategy

from roll_lightning.checkpoints import StepCheckpoint, resolve_ckpt_path, use_checksummed_io
from roll_lightning.checks.handmade import FixedBatches, handmade_batch
from roll_lightning.training.module import AgentRLModule


def trainer(root: Path, distributed: bool) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=1, process_group_backend="gloo",
        save_distributed_checkpoint=distributed,
    )  # fmt: skip
    return use_checksummed_io(
        L.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            default_root_dir=root,
            logger=False,
            max_steps=-1,
            max_epochs=-1,
            callbacks=[StepCheckpoint()],
            enable_progress_bar=False,
            enable_model_summary=False,
        )
    )


def main(model_dir: str, root: str, distributed: str) -> None:
    from transformers import AutoTokenizer

    batch = handmade_batch(Path(model_dir), AutoTokenizer.from_pretrained(model_dir))
    sharded = distributed == "1"
    first = trainer(Path(root), sharded)
    first.fit(AgentRLModule(model_dir, rollout_steps=2), datamodule=FixedBatches(batch))
    resumed = trainer(Path(root), sharded)
    path = resolve_ckpt_path("last", resumed, fitting=True)
    module = AgentRLModule(model_dir, rollout_steps=3)
    resumed.fit(module, datamodule=FixedBatches(batch), ckpt_path=path)
    if resumed.global_rank == 0:
        report = {"resolved": path, "rollout_steps": module.steps_done, "global_step": resumed.global_step}
        (Path(root) / "report.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:4])
