"""Shared fixtures: real env servers on 127.0.0.1 (random free ports), in a thread or as a process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # `support.*` importable here and in server subprocesses (via PYTHONPATH)

import support.plugin_envs  # noqa: E402,F401  (registers crashy/slow)
from support.servers import ALL_ENVS, start_server  # noqa: E402,F401  (re-exported for the tests)

from env_servers.server import RunningServer  # noqa: E402


@pytest.fixture
def server() -> Iterator[RunningServer]:
    running = start_server()
    yield running
    running.stop()


@pytest.fixture
def subprocess_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let server subprocesses import `support.plugin_envs`."""
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{Path(__file__).parent.parent}")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny local chat model, built once per test session."""
    from roll_lightning.models.tiny import tiny_model

    return tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
