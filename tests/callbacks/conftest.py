"""The tiny model's tokenizer, shared by the dump and viewer tests."""

from __future__ import annotations

from typing import Any

import pytest

from roll_lightning.models.tiny import tiny_model


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0))
