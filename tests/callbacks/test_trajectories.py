"""`TrajectoryDump`: JSONL dumps every N rollout steps from a real `L.Trainer`, and the viewer's rendering
(run in node where it is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from support.trainers import quiet_trainer
from torch.utils.data import DataLoader

from roll_lightning.callbacks.trajectories import (
    TrajectoryDump,
    episode_record,
    sample_episodes,
    viewer_html,
)
from roll_lightning.models.tiny import tiny_model
from roll_lightning.rollout.batch import RolloutBatch, collate
from roll_lightning.rollout.episode import Episode, Turn

SOKOBAN = "#####\n#P_O#\n#_X_#\n#####"
FROZEN = "P_O\n___\n__G"
XSS = "<script>alert(1)</script><answer>Left</answer>"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0))


def prompt_text(tokenizer: Any, observation: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Turn 1:\n{observation}"}], tokenize=False, add_generation_prompt=True
    )


def make_episodes(tokenizer: Any, step: int) -> list[Episode]:
    """Three groups of two (sokoban, frozenlake, sokoban); seeds encode the step, so a dump of a stale batch
    would show. Member 0 of each group plays two turns and succeeds; member 1 plays one invalid turn."""
    episodes = []
    for g, (env_id, board) in enumerate([("sokoban", SOKOBAN), ("frozenlake", FROZEN), ("sokoban", SOKOBAN)]):
        prompt = tokenizer.encode(prompt_text(tokenizer, board), add_special_tokens=False)
        for member in range(2):
            reply_ids = tokenizer.encode(XSS, add_special_tokens=False) + [tokenizer.eos_token_id]
            first = Turn(prompt, reply_ids, [-0.5] * len(reply_ids), "stop", step, observation=board, reply=XSS)
            if member == 0:
                first.reward, first.metrics = 0.5, {"success": 0.0, "nan_metric": float("nan")}
                second = Turn([5, 6], [7, 8, 9], [-0.1] * 3, "length", step + 1, observation=board + "\nmoved")
                second.reply, second.reward, second.metrics = "Right", 1.0, {"success": 1.0}
                turns, end = [first, second], "terminated"
            else:
                first.reward, first.action_valid, first.metrics = -0.1, False, {"success": 0.0}
                turns, end = [first], "max_turns"
            episodes.append(
                Episode(
                    group_index=g,
                    member=member,
                    seed=1000 * step + g,
                    env_id=env_id,
                    episode_id=f"e{step}-{g}-{member}",
                    turns=turns,
                    end_reason=end,  # type: ignore[arg-type]
                )
            )
    return episodes


class RolloutModule(L.LightningModule):
    """Shaped like `AgentRLModule` where the callback looks: batch via ``dataloader_iter``, ``last_batch`` and
    ``rollout_steps`` set in ``training_step``. ``bare``: neither attribute (the fallbacks)."""

    def __init__(self, bare: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.bare = bare
        if not bare:
            self.rollout_steps = 0
            self.last_batch: RolloutBatch | None = None

    def training_step(self, dataloader_iter: Any) -> None:
        batch, _, _ = next(dataloader_iter)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward((self.weight - 1).pow(2).sum())
        opt.step()
        if not self.bare:
            self.last_batch = batch
            self.rollout_steps += 1

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
        "turns": [
            {
                "turn": 0,
                "observation": SOKOBAN,
                "reply": XSS,
                "reward": 0.5,
                "action_valid": True,
                "metrics": {"success": 0.0, "nan_metric": None},  # NaN is not JSON: the viewer could not parse it
                "response_tokens": len(tokenizer.encode(XSS, add_special_tokens=False)) + 1,
                "finish_reason": "stop",
                "policy_version": 4,
            },
            {
                "turn": 1,
                "observation": SOKOBAN + "\nmoved",
                "reply": "Right",
                "reward": 1.0,
                "action_valid": True,
                "metrics": {"success": 1.0},
                "response_tokens": 3,
                "finish_reason": "length",
                "policy_version": 5,
            },
        ],
    }
    failed = records[3]
    assert (failed["success"], failed["end_reason"], failed["score"]) == (False, "max_turns", -0.1)
    assert failed["turns"][0]["action_valid"] is False
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
    module = SimpleNamespace(rollout_steps=1, last_batch=batch)
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


def test_viewer_is_self_contained() -> None:
    html = viewer_html()
    assert not re.search(r"https?://|//cdn|\bsrc\s*=|<link\b|@import", html, re.IGNORECASE)
    script = re.search(r"<script>(.*?)</script>", html, re.DOTALL)
    assert script is not None
    # Every untrusted field goes through esc() (the node test below checks the output where node exists).
    for field in ("t.reply", "t.observation", "ep.prompt", "ep.traj", "ep.env_id"):
        assert re.search(rf"esc\({re.escape(field)}\)|renderBoard\({re.escape(field)}", script.group(1)), field


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_viewer_renders_a_dump_escaped(tmp_path: Path, tokenizer: Any) -> None:
    """The viewer's own functions (run in node) on a real dump: markup in replies/prompts comes out as text,
    boards get per-env cells."""
    path = TrajectoryDump(every_n_steps=1, dirpath=str(tmp_path)).dump(make_episodes(tokenizer, 1), 1, tokenizer)
    script = re.search(r"<script>(.*?)</script>", viewer_html(), re.DOTALL).group(1)  # type: ignore[union-attr]
    harness = tmp_path / "harness.js"
    harness.write_text(
        script
        + "\nconst eps = parseJsonl(require('fs').readFileSync(process.argv[2], 'utf8'));\n"
        + "console.log(JSON.stringify({list: renderList(eps, 0), turns: eps.flatMap((ep) =>"
        + " ep.turns.map((_, k) => renderTurn(ep, k)))}));\n"
    )
    result = subprocess.run(["node", str(harness), str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    html = out["list"] + "".join(out["turns"])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;|im_start|&gt;" in html  # the prompt's chat template, escaped
    # Turns in file order: g0m0 (two turns), g0m1 (one, invalid), g1m0 (frozenlake), ...
    sokoban, frozen = out["turns"][0], out["turns"][3]
    assert 'class="c sokoban-wall"' in sokoban and 'class="c sokoban-target"' in sokoban
    assert 'class="c frozenlake-hole"' in frozen and 'class="c frozenlake-goal"' in frozen
    assert '<div class="note">moved</div>' in out["turns"][1]  # text under the board stays text
    assert "return so far <b>1.5</b>" in out["turns"][1] and "badge bad" in out["turns"][2]
