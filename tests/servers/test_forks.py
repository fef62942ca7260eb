"""Forkable sessions (issue 49): every built-in env, and the Gymnasium and GEM adapters, pass the fork rules with
copies that are exact and independent (RNG streams included); envs that fork wrong, and a server that forgets its
forks, fail exactly the rule for their bug; an env that cannot fork is refused in one named status; copies obey
the server's capacity and drain like any session."""

from __future__ import annotations

import grpc
import pytest
import support.fork_envs  # noqa: F401  (registers the trail envs)
from support.misbehaving import ForkRetryMakesMore, UnaryOnly, start_misbehaving
from support.servers import start_server

from env_servers.conformance import run_conformance
from env_servers.server.sessions import ProtocolError, SessionTable
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

FORK_RULES = ["fork-exact", "fork-independent", "fork-retry", "fork-refused", "fork-sessions"]


def fork_results(address: str, env_id: str, **options: object) -> dict[str, str]:
    results = run_conformance(address, env_id, only=FORK_RULES, report=lambda line: None, **options)  # type: ignore[arg-type]
    return {name: outcome.status for name, outcome in results.items()}


@pytest.mark.parametrize(
    ("env_id", "config"),
    [
        ("sokoban", {}),
        ("frozenlake", {"is_slippery": True}),  # its moves draw from its RNG: the copy must draw the same
        ("webshop", {}),
        ("calculator", {}),
        ("lookup", {}),
        ("trail", {}),
        ("gym:FrozenLake-v1", {"make_kwargs": '{"is_slippery": true}'}),
        ("gem:game:Game2048-v0-easy", {}),  # a new tile at random after every move
    ],
)
def test_forkable_envs_pass_every_fork_rule(env_id: str, config: dict) -> None:
    running = start_server(env_ids=(env_id,), max_sessions=32)
    try:
        assert fork_results(running.address, env_id, config=config) == dict.fromkeys(FORK_RULES, "PASS")
    finally:
        running.stop()


@pytest.mark.parametrize("env_id", ["trail-shared-rng", "trail-shallow"])
def test_an_env_that_forks_wrong_fails_the_fork_rules(env_id: str) -> None:
    running = start_server(env_ids=(env_id,), max_sessions=32)
    try:
        got = fork_results(running.address, env_id)
    finally:
        running.stop()
    assert got == {"fork-exact": "FAIL", "fork-independent": "FAIL", "fork-retry": "PASS", "fork-refused": "PASS",
                   "fork-sessions": "PASS"}  # fmt: skip


def test_a_server_that_forgets_its_forks_fails_fork_retry() -> None:
    running = start_misbehaving(ForkRetryMakesMore, env_ids=("trail",))
    try:
        got = fork_results(running.address, "trail")
    finally:
        running.stop()
    assert got == {**dict.fromkeys(FORK_RULES, "PASS"), "fork-retry": "FAIL"}


def test_an_env_that_cannot_fork_is_refused_by_name_and_its_rules_skip() -> None:
    running = start_server(env_ids=("trail-fixed",), max_sessions=8)
    try:
        assert fork_results(running.address, "trail-fixed") == {**dict.fromkeys(FORK_RULES, "SKIP"),
                                                                 "fork-refused": "PASS"}  # fmt: skip
        stub_channel = grpc.insecure_channel(running.address)
        stub = pb_grpc.EnvServiceStub(stub_channel)
        created = stub.CreateSession(pb.CreateSessionRequest(env_id="trail-fixed", request_id="c1"))
        assert not created.spec.forkable
        stub.Reset(pb.ResetRequest(session_id=created.session_id, seed=1, request_id="r1"))
        with pytest.raises(grpc.RpcError) as refused:
            stub.ForkSession(pb.ForkSessionRequest(session_id=created.session_id, copies=1, request_id="f1"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert refused.value.details() == "env 'trail-fixed' cannot be forked (EnvSpec.forkable is false)"
        stub_channel.close()
    finally:
        running.stop()


def test_fork_rules_skip_on_a_server_without_the_capability() -> None:
    running = start_misbehaving(UnaryOnly, env_ids=("trail",))
    try:
        assert set(fork_results(running.address, "trail").values()) == {"SKIP"}
    finally:
        running.stop()


def _started(table: SessionTable) -> str:
    session_id = table.create(pb.CreateSessionRequest(env_id="trail", request_id="c")).session_id
    table.run(session_id, lambda s: s.reset(pb.ResetRequest(session_id=session_id, seed=3, request_id="r")))
    return session_id


def test_copies_that_do_not_fit_are_not_made_and_a_draining_server_forks_nothing() -> None:
    table = SessionTable(["trail"], max_sessions=3, session_ttl_s=60)
    session_id = _started(table)
    with pytest.raises(ProtocolError) as full:
        table.fork(pb.ForkSessionRequest(session_id=session_id, copies=3, request_id="f1"))
    assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and len(table) == 1  # none of the 3 was made
    assert "room for 2 more sessions, not 3 copies" in full.value.message
    assert len(table.fork(pb.ForkSessionRequest(session_id=session_id, copies=2, request_id="f2")).forks) == 2
    with pytest.raises(ProtocolError) as draining:
        table.fork(pb.ForkSessionRequest(session_id=session_id, copies=1, request_id="f3"), draining=True)
    assert draining.value.code == grpc.StatusCode.UNAVAILABLE and draining.value.message.startswith("draining")
    # a retried fork is still answered while draining: it makes nothing
    again = table.fork(pb.ForkSessionRequest(session_id=session_id, copies=2, request_id="f2"), draining=True)
    assert len(again.forks) == 2 and len(table) == 3
