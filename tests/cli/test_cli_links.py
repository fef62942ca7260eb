"""Settings that one key decides: ``seed_everything`` seeds every part of a run (setting a part's own seed is
refused: `test_errors.py`), and ``model.dtype`` is the engine's unless ``data.engine.dtype`` says otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import build_cli

from roll_lightning.models.precision import native_bf16


def test_seed_everything_seeds_the_model_the_boards_and_the_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = build_cli(tmp_path, monkeypatch, "--seed_everything", "5")
    data = built.datamodule
    assert (built.model.seed, data.rollout.seed, data.engine_config.seed) == (5, 5, 5)
    default = build_cli(tmp_path, monkeypatch)
    assert (default.model.seed, default.datamodule.rollout.seed, default.datamodule.engine_config.seed) == (0, 0, 0)


def test_the_engine_generates_in_the_trainers_dtype_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def engine_dtype(*args: str) -> str:
        return build_cli(tmp_path, monkeypatch, *args).datamodule.engine_config.weights_dtype("cpu")

    assert engine_dtype() == "float32"
    assert engine_dtype("--model.dtype", "bfloat16") == "bfloat16"
    assert engine_dtype("--model.dtype", "bfloat16", "--data.engine.dtype", "float16") == "float16"
    # auto follows the trainer's setting and is resolved for the engine's own device: this CPU's flags decide
    assert engine_dtype("--model.dtype", "auto") == ("bfloat16" if native_bf16("cpu") else "float32")
