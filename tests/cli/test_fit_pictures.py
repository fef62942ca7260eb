"""``fit`` with pictures, as users run it: the tiny Qwen2-VL model trains on a FrozenLake that sends its board as a
PNG beside a text-only FrozenLake in the same run, resumes from its checkpoint, and a text-only model pointed at a
picture env is told so in one line before any work."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from support.cli import TINY, TWO_RANKS, dumped_episodes, fit_tiny, logged_metrics, run_cli

PICTURES = {"tag": "pixels", "env_id": "frozenlake", "env_config": {"size": 4, "render": "image"}, "groups": 1}
WORDS = {"tag": "words", "env_id": "frozenlake", "env_config": {"size": 4}, "groups": 1}


def _config(path: Path, *envs: dict) -> str:
    rollout = {"env_id": None, "envs": list(envs), "episode": {"max_turns": 2, "sampling": {"max_new_tokens": 6}}}
    path.write_text(yaml.safe_dump({"model": {"model": "tiny-vl"}, "data": {"rollout": rollout}}))
    return str(path)


def _fit(tmp_path: Path, extra: str, steps: int, *more: str) -> None:
    done = fit_tiny(tmp_path, extra, steps, *more)
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_picture_env_and_a_text_env_train_together_and_resume(tmp_path: Path) -> None:
    extra = _config(tmp_path / "vl.yaml", PICTURES, WORDS)
    _fit(tmp_path, extra, 2)
    root = tmp_path / "run"
    logged = logged_metrics(root)
    assert logged["env/image_bytes"] > 100 and logged["timing/image_encode_s"] > 0
    assert logged["rollout/pixels/episodes"] > 0 and logged["rollout/words/episodes"] > 0
    dumped = dumped_episodes(root)
    assert {"<image>" in ep["turns"][0]["observation"] for ep in dumped if ep["turns"]} == {True, False}

    _fit(tmp_path, extra, 3, "--ckpt_path", "last")  # one more step from the checkpoint, pictures and all
    state = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["rollout_steps"] == 3
    assert any("visual" in name for name in state["state_dict"])  # the vision encoder trains and is saved


def test_two_fsdp2_ranks_train_on_pictures(tmp_path: Path) -> None:
    """Each rank's rows keep their own pictures through FSDP2 (gloo on the CPU), in micro-batches of a few rows (an
    entropy bonus makes every batch train, whatever the random model's rewards)."""
    extra = _config(tmp_path / "vl.yaml", {**PICTURES, "groups": 2})
    more = ("--model.algorithm.max_tokens_per_micro", "256", "--model.algorithm.entropy_coef", "0.01")
    _fit(tmp_path, extra, 1, *TWO_RANKS, *more)
    logged = logged_metrics(tmp_path / "run")
    assert logged["env/image_bytes"] > 100 and logged["train/update_skipped"] == 0 and "train/entropy" in logged


def test_a_text_model_given_a_picture_env_is_told_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "text.yaml"
    path.write_text(yaml.safe_dump({"data": {"rollout": {"env_config": {"size": 4, "render": "image"}}}}))
    done = run_cli(
        "fit", "--config", TINY, "--config", str(path), "--trainer.default_root_dir", str(tmp_path), cwd=tmp_path
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "sends images, but the model has no image processor" in last and "env_config" in last, last
