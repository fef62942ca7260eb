"""`RolloutDataModule` under a real Lightning Trainer: batches flow, checkpoints carry the rollout position."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from support.trainers import quiet_trainer

from roll_lightning.rollout import EpisodeSettings, RolloutBatch, RolloutConfig
from roll_lightning.rollout.datamodule import EnvsConfig, RolloutDataModule
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.factory import EngineConfig


def datamodule(model_dir: Path, **rollout: Any) -> RolloutDataModule:
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))
    cfg = RolloutConfig(
        env_id="frozenlake", group_size=2, batch_size=4, episode=episode, **{"max_staleness": 0, **rollout}
    )
    return RolloutDataModule(str(model_dir), rollout=cfg, envs=EnvsConfig(endpoints="local"), engine=EngineConfig())


class RecordingModule(L.LightningModule):
    """Stands in for the training module: records what it was fed, takes a trivial optimizer step."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.groups: list[list[str]] = []

    def training_step(self, dataloader_iter: Iterator[Any]) -> None:
        # `dataloader_iter`, as an on-policy module must: Lightning then fetches no batch ahead of the step
        batch, _, _ = next(dataloader_iter)
        assert isinstance(batch, RolloutBatch)
        self.groups.append(sorted(set(batch.traj_group_id)))
        self.log("rollout/success_rate", batch.metrics["rollout/success_rate"], batch_size=len(batch))
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1).pow(2).sum())
        opt.step()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(tmp_path: Path, max_steps: int) -> L.Trainer:
    return quiet_trainer(tmp_path, max_steps=max_steps, enable_checkpointing=True)


def test_standalone_setup_batches_and_teardown(model_dir: Path) -> None:
    dm = datamodule(model_dir)
    dm.setup("fit")
    try:
        first, second = dm.next_batch(), dm.next_batch()
        state = dm.state_dict()
    finally:
        dm.teardown("fit")
    assert len(first) == len(second) == 4
    assert not set(first.traj_group_id) & set(second.traj_group_id)
    (rank,) = state["ranks"]
    placed = {"base": 0, "stride": 1, "offset": 0, "adopted": []}  # rank 0 of 1, nothing handed over by a resume
    assert rank["lanes"] == {"frozenlake": {"next_local": 4, "watermark": 4, "settled_above": [], **placed}}
    assert (rank["batches"], rank["seed"], rank["world_size"]) == (2, 0, 1)
    with pytest.raises(RuntimeError, match="not set up"):
        dm.next_batch()


def test_fit_and_resume_from_a_checkpoint_continue_the_group_sequence(model_dir: Path, tmp_path: Path) -> None:
    straight = RecordingModule()
    trainer(tmp_path / "a", 3).fit(straight, datamodule=datamodule(model_dir))

    first = RecordingModule()
    t = trainer(tmp_path / "b", 1)
    t.fit(first, datamodule=datamodule(model_dir))
    ckpt = tmp_path / "b" / "step1.ckpt"
    t.save_checkpoint(ckpt)
    resumed = RecordingModule()
    trainer(tmp_path / "b", 3).fit(resumed, datamodule=datamodule(model_dir), ckpt_path=ckpt)

    assert len(straight.groups) == 3 and len(first.groups) == 1 and len(resumed.groups) == 2
    assert first.groups + resumed.groups == straight.groups  # nothing repeated, nothing skipped


def test_two_ranks_play_disjoint_shards_of_the_group_sequence(model_dir: Path, tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "support" / "two_rank_rollout.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(script.parent.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [len(r) for r in ranks] == [2, 2]  # one batch per step per rank
    indices = [{int(g.split("/")[1][1:]) for batch in r for g in batch} for r in ranks]
    assert indices == [{0, 2, 4, 6}, {1, 3, 5, 7}]


def test_a_model_folder_that_does_not_exist_fails_before_any_work(tmp_path: Path) -> None:
    dm = RolloutDataModule(str(tmp_path / "nope"))
    with pytest.raises(OSError):
        dm.setup("fit")
    assert dm.scheduler is None


def test_evaluation_replays_the_same_held_out_starts_disjoint_from_training(model_dir: Path) -> None:
    from roll_lightning.rollout.datamodule import EvalConfig

    dm = datamodule(model_dir)
    dm.evaluation = EvalConfig(episodes=4, temperature=0.0)
    dm.setup("fit")
    try:
        first, second = dm.evaluate(), dm.evaluate()
        train = dm.next_batch()
    finally:
        dm.teardown("fit")
    eval_seeds = [int(g.rsplit("/s", 1)[1]) for g in first.traj_group_id]
    train_seeds = [int(g.rsplit("/s", 1)[1]) for g in train.traj_group_id]
    assert sorted(first.traj_group_id) == sorted(second.traj_group_id)  # the same starts, whatever the order
    assert {g.split("/")[1] for g in first.traj_group_id} == {"g0", "g1", "g2", "g3"}  # exactly those asked for
    assert len(set(eval_seeds)) == 4  # one episode per start
    assert all(s % 2 == 1 for s in eval_seeds) and all(s % 2 == 0 for s in train_seeds)

    def replies(batch: Any) -> dict[str, list[list[int]]]:
        return {ep.traj_key: [t.response_ids for t in ep.turns] for ep in batch.episodes}

    assert replies(first) == replies(second)  # greedy: the same replies
