"""Shared fixtures: real env servers on 127.0.0.1 (random free ports), in a thread or as a process; and the tiers.

Tiers (markers, `--strict-markers`): every test is ``unit`` or ``integration``; some integration tests are also
``slow``; ``gpu`` ones need CUDA. `pytest -m unit` is the fast lane (well under a minute: pure functions, envs,
configs, the pinned losses; no env server, no CLI run); `pytest -m "not slow"` skips the learning runs; plain
`pytest` (what CI runs) runs everything.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # `support.*` importable here and in server subprocesses (via PYTHONPATH)

import support.plugin_envs  # noqa: E402,F401  (registers crashy/slow)
from support.recipes import RECIPES, Recipe, start_recipes  # noqa: E402
from support.servers import ALL_ENVS, start_server  # noqa: E402,F401  (re-exported for the tests)

from env_servers.server import RunningServer  # noqa: E402

UNIT = {  # test files (relative to tests/) whose every test is pure and fast
    "algorithms/test_advantages.py",
    "algorithms/test_algorithm_properties.py",
    "algorithms/test_correction.py",
    "algorithms/test_losses.py",
    "algorithms/test_objective.py",
    "callbacks/test_progress.py",
    "checkpoints/test_certificate_parts.py",
    "servers/envs/test_board_images.py",
    "servers/envs/test_calculator.py",
    "servers/envs/test_lookup.py",
    "servers/envs/test_lookup_warmup.py",
    "models/test_tiny_tools.py",
    "models/test_precision.py",
    "servers/envs/test_frozenlake.py",
    "servers/envs/test_sokoban.py",
    "servers/test_capabilities.py",
    "servers/test_tool_schema.py",
    "protocol/test_stubs.py",
    "rollout/test_chat.py",
    "rollout/test_engine_choice.py",
    "rollout/test_scheduler_parts.py",
    "rollout/test_tool_calls.py",
    "training/test_config_ranges.py",
    "training/test_forward.py",
    "training/test_pinned_losses.py",
    "test_docs.py",
    "test_readme.py",
}
SLOW = {"cli/test_learning.py"}  # minutes each: the CPU recipes learning


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier; the slow ones run last (their recipes start with the suite, see below)."""
    slow: list[pytest.Item] = []
    for item in items:
        where = Path(str(item.fspath)).resolve().relative_to(TESTS.resolve()).as_posix()
        if item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.unit if where in UNIT else pytest.mark.integration)
        if where in SLOW:
            item.add_marker(pytest.mark.slow)
            slow.append(item)
    items[:] = [item for item in items if item not in slow] + slow


@pytest.fixture(scope="session", autouse=True)
def learning_recipes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Recipe]]:
    """The learning runs of the selected learning tests (test name -> `support.recipes.Recipe`), started before the
    first test at the lowest CPU priority: they count steps, so they use what the rest of the suite leaves idle,
    and the learning tests, last, find them (nearly) done instead of running them for ten minutes after
    everything else. Runs still going when the session ends are stopped."""
    names = [item.name for item in request.session.items if item.name in RECIPES]
    started = start_recipes(names, tmp_path_factory.mktemp("recipes")) if names else {}
    yield started
    for recipe in started.values():
        recipe.stop()


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
