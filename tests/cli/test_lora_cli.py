"""``model.lora`` from the command line: the engine is built for the policy's rank, and bad values name their key."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cli import build_cli as cli


def test_the_lora_rank_reaches_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.lora.rank`` is linked to ``data.engine.max_lora_rank`` (vLLM is then built to serve the adapters)
    unless ``model.lora.sync: merged``; a list of target modules is read from YAML."""
    lora = cli(tmp_path, monkeypatch, "--model.lora.rank", "8", "--model.lora.target_modules", "[q_proj, v_proj]")
    assert lora.model.lora.rank == lora.datamodule.engine_config.max_lora_rank == 8
    assert lora.model.lora.target_modules == ("q_proj", "v_proj")
    merged = cli(tmp_path, monkeypatch, "--model.lora.rank", "8", "--model.lora.sync", "merged")
    assert merged.model.lora.rank == 8 and merged.datamodule.engine_config.max_lora_rank == 0  # vLLM gets weights
    full = cli(tmp_path, monkeypatch)
    assert full.model.lora.rank == full.datamodule.engine_config.max_lora_rank == 0


def test_a_bad_lora_value_names_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from roll_lightning.training.config import TrainingConfigError

    with pytest.raises(TrainingConfigError, match=r"model\.lora\.alpha must be > 0, got 0\.0"):
        cli(tmp_path, monkeypatch, "--model.lora.rank", "4", "--model.lora.alpha", "0")
