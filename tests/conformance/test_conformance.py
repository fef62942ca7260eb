"""Every Python env server passes the conformance suite, with two server processes for the determinism check.

(The Node server runs the same suite in tests/test_node_server.py.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from env_servers.conformance import CHECKS, run_conformance
from roll_lightning.envs.local import launch_local_server

PYTHON_ENVS = ["sokoban", "frozenlake", "webshop"]


@pytest.fixture(scope="module")
def two_servers():
    servers = [launch_local_server(PYTHON_ENVS) for _ in range(2)]
    yield [s.address for s in servers]
    for server in servers:
        server.stop()


@pytest.mark.parametrize("env_id", PYTHON_ENVS)
def test_python_env_servers_conform(two_servers, env_id):
    check_all(two_servers, env_id)


# Envs served through the optional adapters: (module the extra provides, why it may be missing, env ids).
ADAPTERS = {
    "gem": (
        "the optional gem-llm extra is not installed (needs Python <= 3.12.0)",
        ["gem:game:GuessTheNumber-v0-easy", "gem:game:Minesweeper-v0-easy"],
    ),
    "gymnasium": ("the optional [gym] extra is not installed", ["gym:FrozenLake-v1", "gym:Blackjack-v1"]),
}


@pytest.mark.parametrize(
    ("module", "env_id"), [(module, env_id) for module, (_, ids) in ADAPTERS.items() for env_id in ids]
)
def test_adapter_envs_conform(module, env_id):
    reason, env_ids = ADAPTERS[module]
    pytest.importorskip(module, reason=reason)
    servers = [launch_local_server(env_ids) for _ in range(2)]
    try:
        check_all([s.address for s in servers], env_id)
    finally:
        for server in servers:
            server.stop()


def check_all(addresses: list[str], env_id: str) -> None:
    """Run the whole suite against ``addresses[0]``, with ``addresses[1]`` for the cross-process determinism check."""
    lines: list[str] = []
    results = run_conformance(addresses[0], env_id, second=addresses[1], report=lines.append)
    assert set(results) == set(CHECKS)
    assert not {name: msg for name, msg in results.items() if msg}, "\n".join(lines)


def test_the_command_reports_and_exits_1_when_a_check_fails(two_servers):
    ok = subprocess.run(
        [sys.executable, "-m", "env_servers", "conformance", two_servers[0], "--env", "frozenlake"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ok.returncode == 0 and f"{len(CHECKS)}/{len(CHECKS)} checks passed" in ok.stdout, ok.stdout + ok.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "env_servers", "conformance", two_servers[0], "--env", "frozenlake",
         "--config", '{"size": 4}', "--second", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 1 and "FAIL  determinism" in bad.stdout, bad.stdout + bad.stderr
