"""Training fixtures: the tiny local model (built once per test session) and its tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from roll_lightning.models.tiny import tiny_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
