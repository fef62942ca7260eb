"""Rollout fixtures: the tiny local model (built once per test session), its tokenizer, real env servers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.servers import start_server

from env_servers.server import RunningServer
from roll_lightning.env_client import EnvPool
from roll_lightning.models.tiny import tiny_model


@pytest.fixture(scope="session")
def model_dir_seed1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.getbasetemp() / "models", seed=1)


@pytest.fixture(scope="module")
def env_server() -> Iterator[RunningServer]:
    running = start_server()
    yield running
    running.stop()


@pytest.fixture
async def pool(env_server: RunningServer) -> AsyncIterator[EnvPool]:
    async with EnvPool([env_server.address], health_interval_s=0.2) as p:
        yield p
