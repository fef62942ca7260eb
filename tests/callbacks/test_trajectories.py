"""`TrajectoryDump`: JSONL dumps every N rollout steps from a real `L.Trainer` (the viewer: test_viewer.py)."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch
from PIL import Image
from support.episodes import SOKOBAN, XSS, make_episodes, make_pictured_episodes, prompt_text
from support.trainers import quiet_trainer
from torch.utils.data import DataLoader

from roll_lightning.callbacks.trajectories import (
    TrajectoryDump,
    episode_record,
    sample_episodes,
)
from roll_lightning.rollout.episodes.batch import RolloutBatch, collate
from roll_lightning.rollout.episodes.episode import Episode
from roll_lightning.training.eval_report import FitRecord


class RolloutModule(L.LightningModule):
    """Shaped like `AgentRLModule` where the callback looks: batch via ``dataloader_iter``, ``fit_record`` with
    ``last_batch`` and ``last_row_advantages`` (here row i gets 10 * i), and ``steps_done``, set in
    ``training_step``. ``bare``: none of them (the fallbacks)."""

    def __init__(self, bare: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.bare = bare
        if not bare:
            self.steps_done = 0
            self.fit_record = FitRecord()

    def training_step(self, dataloader_iter: Any) -> None:
        batch, _, _ = next(dataloader_iter)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1).pow(2).sum())
        opt.step()
        if not self.bare:
            self.fit_record.last_batch = batch
            self.fit_record.last_row_advantages = [10.0 * i for i in range(len(batch))]
            self.steps_done += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([self.weight], lr=0.1)


class HandmadeData(L.LightningDataModule):
    def __init__(self, tokenizer: Any, steps: int) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        # Batch i is what rollout step i + 1 trains on.
        self.batches = [
            collate(make_episodes(tokenizer, i + 1), "trajectory", tokenizer.pad_token_id) for i in range(steps)
        ]

    def train_dataloader(self) -> DataLoader[RolloutBatch]:
        return DataLoader(self.batches, batch_size=None, collate_fn=lambda b: b)  # type: ignore[arg-type]


def fit(tmp_path: Path, tokenizer: Any, callback: TrajectoryDump, steps: int, bare: bool = False) -> None:
    trainer = quiet_trainer(tmp_path, max_steps=steps, callbacks=[callback])
    trainer.fit(RolloutModule(bare=bare), datamodule=HandmadeData(tokenizer, steps))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_dumps_every_n_steps_with_exact_records(tmp_path: Path, tokenizer: Any) -> None:
    fit(tmp_path, tokenizer, TrajectoryDump(every_n_steps=2, max_episodes=4), steps=5)
    out = tmp_path / "trajectories"
    files = ["index.html", "index.json", "step_000002.jsonl", "step_000004.jsonl"]
    assert sorted(p.name for p in out.iterdir()) == files
    assert json.loads((out / "index.json").read_text()) == {"files": ["step_000002.jsonl", "step_000004.jsonl"]}

    records = read_jsonl(out / "step_000004.jsonl")
    # One per group first (g0, g1, g2), then the second member of g0; every one from step 4's batch.
    assert [r["traj"] for r in records] == [
        "sokoban/g0/s4000/m0",
        "frozenlake/g1/s4001/m0",
        "sokoban/g2/s4002/m0",
        "sokoban/g0/s4000/m1",
    ]
    first = records[0]
    assert first == {
        "step": 4,
        "env_id": "sokoban",
        "tag": "sokoban",
        "group": "sokoban/g0/s4000",
        "traj": "sokoban/g0/s4000/m0",
        "seed": 4000,
        "member": 0,
        "episode_id": "e4-0-0",
        "end_reason": "terminated",
        "score": 1.5,
        "success": True,
        "policy_version": 4,
        "prompt": prompt_text(tokenizer, SOKOBAN),
        "final_observation": SOKOBAN + "\nsolved",  # the board after the last move
        "final_images": [],  # a text env: no pictures
        "turns": [
            {
                "turn": 0,
                "observation": SOKOBAN,
                "images": [],
                "reply": XSS,
                "reply_prefix": "",
                "tool_results": [],
                "reward": 0.5,
                "action_valid": True,
                "metrics": {"success": 0.0, "nan_metric": None},  # NaN is not JSON: the viewer could not parse it
                "response_tokens": len(tokenizer.encode(XSS, add_special_tokens=False)) + 1,
                "finish_reason": "stop",
                "policy_version": 4,
                "versions": [],  # one version sampled it all
                "advantage": 0.0,  # trajectory rows: row 0 (this episode) covers both turns
            },
            {
                "turn": 1,
                "observation": SOKOBAN + "\nmoved",
                "images": [],
                "reply": "<answer>Right</answer>",
                "reply_prefix": "<answer>",
                "tool_results": [],
                "reward": 1.0,
                "action_valid": True,
                "metrics": {"success": 1.0},
                "response_tokens": 3,
                "finish_reason": "length",
                "policy_version": 4,  # as old as its oldest token
                "versions": [[0, 4], [1, 5]],  # token 0 from weights v4, tokens 1-2 from v5
                "advantage": 0.0,
            },
        ],
        "branch": None,  # not forked from another member (data.rollout.branch)
    }
    failed = records[3]
    assert (failed["success"], failed["end_reason"], failed["score"]) == (False, "max_turns", -0.1)
    assert failed["turns"][0]["action_valid"] is False and failed["turns"][0]["advantage"] == 10.0  # row 1
    assert read_jsonl(out / "step_000002.jsonl")[0]["seed"] == 2000


def test_explicit_dirpath_no_tokenizer_and_all_episodes(tmp_path: Path, tokenizer: Any) -> None:
    out = tmp_path / "dumps"
    callback = TrajectoryDump(every_n_steps=1, max_episodes=0, dirpath=str(out), tokenizer_for_prompts=False)
    fit(tmp_path, tokenizer, callback, steps=2)
    assert not (tmp_path / "trajectories").exists()
    records = read_jsonl(out / "step_000001.jsonl")
    assert len(records) == 6 and all(r["prompt"] is None for r in records)


def test_fallbacks_global_step_and_batch_argument(tmp_path: Path, tokenizer: Any) -> None:
    """A module without ``rollout_steps``/``last_batch``: steps from ``global_step`` (one optimiser step per
    batch here), episodes from the hook's ``batch`` (Lightning passes the batch that ``dataloader_iter`` gave)."""
    fit(tmp_path, tokenizer, TrajectoryDump(every_n_steps=3, max_episodes=1), steps=3, bare=True)
    (record,) = read_jsonl(tmp_path / "trajectories" / "step_000003.jsonl")
    assert record["seed"] == 3000


def test_viewer_written_once_and_index_keeps_older_files(tmp_path: Path, tokenizer: Any) -> None:
    callback = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path))
    (tmp_path / "step_000123.jsonl").write_text("")  # left by the run this one resumes
    episodes = make_episodes(tokenizer, 1)
    callback.dump(episodes, 1000000)
    (tmp_path / "index.html").write_text("edited")
    callback.dump(episodes, 1000001)
    assert (tmp_path / "index.html").read_text() == "edited"
    assert json.loads((tmp_path / "index.json").read_text())["files"] == [
        "step_000123.jsonl",
        "step_1000000.jsonl",  # sorted by number, not by name
        "step_1000001.jsonl",
    ]


def test_rank_zero_only(tmp_path: Path, tokenizer: Any) -> None:
    callback = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path))
    batch = collate(make_episodes(tokenizer, 1), "trajectory", tokenizer.pad_token_id)
    module = SimpleNamespace(steps_done=1, fit_record=FitRecord(last_batch=batch))
    trainer = SimpleNamespace(is_global_zero=False, global_step=1, datamodule=None, default_root_dir=str(tmp_path))
    callback.on_train_batch_end(trainer, module, None, batch, 0)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    trainer.is_global_zero = True
    callback.on_train_batch_end(trainer, module, None, batch, 0)  # type: ignore[arg-type]
    callback.on_train_batch_end(trainer, module, None, batch, 0)  # type: ignore[arg-type]  (same step: once)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.html", "index.json", "step_000001.jsonl"]


def test_sample_episodes_round_robin_over_groups(tokenizer: Any) -> None:
    episodes = make_episodes(tokenizer, 1)
    names = [(e.group_index, e.member) for e in sample_episodes(episodes, 5)]
    assert names == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    assert sample_episodes(episodes, 100) == episodes
    assert episode_record(Episode(0, 0, 1, "x"), 1, tokenizer)["prompt"] is None  # no turns: no prompt


def test_pictures_dumped_as_base64_bytes_only(tmp_path: Path, tokenizer: Any) -> None:
    """An image env's turns: each carries its observation's PNG (base64, with its media type) and the episode its
    final board's; the pixel values are not written (the line is the PNGs' size, not the tensors')."""
    episodes = make_pictured_episodes(tokenizer, 1)
    path = TrajectoryDump(every_n_steps=1, max_episodes=1, dirpath=str(tmp_path)).dump(episodes, 1)
    (record,) = read_jsonl(path)
    source = episodes[0]
    assert [t["observation"] for t in record["turns"]] == [SOKOBAN + "\n<image>", SOKOBAN + "\nmoved\n<image>"]
    for turn, dumped in zip(source.turns, record["turns"], strict=True):
        assert dumped["images"] == [
            {"media_type": "image/png", "data": base64.b64encode(turn.observation_images[0].data).decode()}
        ]
    assert record["final_images"] == [
        {"media_type": "image/png", "data": base64.b64encode(source.final_images[0].data).decode()}
    ]
    # the bytes decode back to the pictures: turn 1's red is 10, the final board's 250
    pixels = [
        Image.open(io.BytesIO(base64.b64decode(i["data"]))).getpixel((0, 0))
        for i in [*record["turns"][1]["images"], *record["final_images"]]
    ]
    assert pixels == [(10, 0, 0), (250, 0, 0)]
    assert "pixel_values" not in path.read_text() and "grid_thw" not in path.read_text()
    assert set(record["final_images"][0]) == {"media_type", "data"}
