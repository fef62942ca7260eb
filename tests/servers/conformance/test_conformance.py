"""The conformance suite against real servers: every Python env passes it; a server started by the suite passes
the loading, drain, crash and token rules too; servers with one protocol bug each fail exactly the check for
that bug; the suite closes what it opens; bad input is one FAIL line, never a traceback.

(The Node server runs the same suite in tests/servers/test_node_server.py.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from support.misbehaving import ServerWideReplay, UnaryOnly, start_misbehaving

from env_servers.conformance import CHECKS, CheckResult, run_conformance
from roll_lightning.env_client.local import launch_local_server
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

PYTHON_ENVS = ["sokoban", "frozenlake", "webshop"]
SMALL = ["--max-sessions", "20", "--session-ttl", "2"]  # small enough for the capacity and reaping rules
NEEDS_LAUNCH = {"loading", "drain"}
FORK_RULES = {"fork-exact", "fork-independent", "fork-retry", "fork-refused", "fork-sessions"}
NEEDS_OPTIONS = {"env-crash", "auth"} | NEEDS_LAUNCH
SERVE = [sys.executable, "-m", "env_servers", "serve"]


@pytest.fixture(scope="module")
def two_servers() -> Iterator[list[str]]:
    servers = [launch_local_server(PYTHON_ENVS, extra_args=SMALL) for _ in range(2)]
    yield [s.address for s in servers]
    for server in servers:
        server.stop()


def outcomes(results: dict[str, CheckResult], status: str) -> set[str]:
    return {name for name, outcome in results.items() if outcome.status == status}


def run(address: str | None, env_id: str, **options: object) -> tuple[dict[str, CheckResult], str]:
    lines: list[str] = []
    results = run_conformance(address, env_id, report=lines.append, **options)  # type: ignore[arg-type]
    return results, "\n".join(lines)


@pytest.mark.parametrize("env_id", PYTHON_ENVS)
def test_python_env_servers_conform(two_servers: list[str], env_id: str) -> None:
    results, report = run(two_servers[0], env_id, second=two_servers[1])
    assert set(results) == set(CHECKS)
    assert not outcomes(results, "FAIL"), report
    assert outcomes(results, "SKIP") == NEEDS_OPTIONS, report
    stub = pb_grpc.EnvServiceStub(grpc.insecure_channel(two_servers[0]))
    assert stub.GetServerInfo(pb.GetServerInfoRequest()).active_sessions == 0, "the suite closed what it opened"


def test_a_server_the_suite_starts_passes_every_rule_including_drain(subprocess_env: None) -> None:
    launch = " ".join([*SERVE, "crashy", "--import", "support.plugin_envs", "--port", "{port}", *SMALL,
                       "--token", "s3cret-token", "--drain-seconds", "30"])  # fmt: skip
    results, report = run(None, "crashy", launch=launch, token="s3cret-token", crash_action="crash", garbage="")
    assert set(results) == set(CHECKS)
    assert not outcomes(results, "FAIL"), report
    assert outcomes(results, "SKIP") == {"garbage-reply"}, report  # crashy takes any text as a valid action


def test_a_replay_cache_keyed_server_wide_fails_replay_scope() -> None:
    """Before: such a server passed 13/13 (only a second run could trip on a fixed id), then corrupted training.
    Its cache also replays a Reset that has gone stale, which the replay rule catches; nothing else fails."""
    running = start_misbehaving(ServerWideReplay)
    try:
        results, report = run(running.address, "frozenlake")
        assert outcomes(results, "FAIL") == {"replay-scope", "replay"}, report
        assert "request ids must be scoped to their session" in results["replay-scope"].detail
    finally:
        running.stop()


def test_capabilities_a_server_does_not_advertise_are_skipped_not_failed() -> None:
    running = start_misbehaving(UnaryOnly)
    try:
        results, report = run(running.address, "frozenlake")
        assert not outcomes(results, "FAIL"), report
        unadvertised = {"batch", "batch-mixed", "stream", "images", "tools", *FORK_RULES}
        assert outcomes(results, "SKIP") == unadvertised | {"capacity", "idle-reaping"} | NEEDS_OPTIONS, report
        assert "does not advertise 'stream'" in results["stream"].detail
    finally:
        running.stop()


def conformance_cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "env_servers", "conformance", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_command_reports_and_exits_1_when_a_check_fails(two_servers: list[str]) -> None:
    ok = conformance_cli(two_servers[0], "--env", "frozenlake")
    ran = len(CHECKS) - len(NEEDS_OPTIONS)
    assert ok.returncode == 0 and f"{ran}/{ran} checks passed, {len(NEEDS_OPTIONS)} skipped" in ok.stdout, ok.stdout
    assert "SKIP  drain  the server was not started by the suite (--launch)" in ok.stdout
    bad = conformance_cli(two_servers[0], "--env", "frozenlake", "--second", "127.0.0.1:1", "--only", "determinism")
    assert bad.returncode == 1 and "FAIL  determinism" in bad.stdout, bad.stdout + bad.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--env", "no-such-env", "--token", "s3cret-token"], "env 'no-such-env'"),
        (["--env", "frozenlake", "--config", '{"sise": 4}', "--token", "s3cret-token"], "sise"),
        (["--env", "frozenlake", "--token", "wrong-token"], "UNAUTHENTICATED"),
        (["--env", "frozenlake", "--DOWN"], "UNAVAILABLE"),
    ],
    ids=["wrong-env", "bad-config", "wrong-token", "server-down"],
)
def test_bad_input_is_one_fail_line_not_a_traceback(args: list[str], says: str) -> None:
    from support.servers import start_server

    running = start_server(token="s3cret-token")
    try:
        address = "127.0.0.1:1" if "--DOWN" in args else running.address
        done = conformance_cli(address, *[a for a in args if a != "--DOWN"])
        assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        (line,) = [x for x in done.stdout.splitlines() if x.startswith("FAIL")]
        assert line.startswith("FAIL  connect") and says in line, done.stdout
    finally:
        running.stop()


def test_a_config_that_is_not_json_is_refused_in_one_line() -> None:
    done = conformance_cli("127.0.0.1:1", "--env", "frozenlake", "--config", "{size: 4")
    assert done.returncode == 2 and "--config is not JSON" in done.stderr and "Traceback" not in done.stderr


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
def test_adapter_envs_conform(module: str, env_id: str) -> None:
    reason, env_ids = ADAPTERS[module]
    pytest.importorskip(module, reason=reason)
    servers = [launch_local_server(env_ids) for _ in range(2)]
    try:
        results, report = run(servers[0].address, env_id, second=servers[1].address)
        assert not outcomes(results, "FAIL"), report
    finally:
        for server in servers:
            server.stop()


def test_an_env_that_declares_deterministic_false_skips_the_rules_that_replay_a_seed(subprocess_env: None) -> None:
    """``dice`` ignores its seed, as it declares: the seed, determinism and deadline rules say why they skipped,
    and every other rule still runs (before, those three failed)."""
    launch = " ".join([*SERVE, "dice", "--import", "support.plugin_envs", "--port", "{port}", *SMALL])
    results, report = run(None, "dice", launch=launch, garbage="")
    assert not outcomes(results, "FAIL"), report
    replaying = {"seeds", "determinism", "deadline"}
    unforkable = {"fork-exact", "fork-independent", "fork-retry", "fork-sessions"}  # fork-refused checks the refusal
    assert outcomes(results, "SKIP") == replaying | unforkable | {"garbage-reply", "env-crash", "auth"}, report
    for name in replaying:
        assert results[name].detail.startswith("the env declares deterministic: false, so "), report
    assert "the seeds were echoed" in results["seeds"].detail
    assert {"batch-mixed", "stream", "replay", "drain"} <= outcomes(results, "PASS"), report
