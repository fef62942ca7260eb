"""The conformance suite: what any env server, in any language, must do to be driven by roll_lightning.

    python -m env_servers conformance 127.0.0.1:50051 --env sokoban [--second 127.0.0.1:50052] [--config JSON]

It speaks the raw protocol (no roll_lightning client logic in between), runs every check below against one
env of the server, prints PASS/FAIL per check with the reason, and exits 1 if any check failed. With
``--second`` (another process of the same server), it also checks that the same seed gives the same episode
on both. The checks follow the header of protos/roll_lightning/env/v1/env.proto.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from roll_lightning.env.v1 import env_pb2 as pb
from roll_lightning.env.v1 import env_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
CODE = {code.value[0]: code for code in grpc.StatusCode}


class CheckFailed(AssertionError):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Target:
    """One server endpoint and the env under test."""

    address: str
    env_id: str
    config: dict[str, Any] = field(default_factory=dict)
    token: str | None = None
    timeout: float = 30.0

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None

    def call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        return getattr(self.stub, method)(request, timeout=timeout or self.timeout, metadata=self.metadata)

    def refused(self, method: str, request: Any, timeout: float | None = None) -> tuple[grpc.StatusCode, str]:
        """The status code and message of a call that must fail."""
        try:
            self.call(method, request, timeout)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
        raise CheckFailed(f"{method} succeeded but should have been refused")

    def open(self) -> str:
        request = pb.CreateSessionRequest(env_id=self.env_id, request_id=_rid())
        request.config.update(self.config)
        return self.call("CreateSession", request).session_id

    def reset(self, session_id: str, seed: int) -> pb.ResetResult:
        return self.call("Reset", pb.ResetRequest(session_id=session_id, seed=seed, request_id=_rid()))

    def step(self, session_id: str, episode_id: str, index: int, text: str, request_id: str = "") -> pb.StepResult:
        request = pb.StepRequest(
            session_id=session_id,
            episode_id=episode_id,
            step_index=index,
            action=pb.Action(text=text),
            request_id=request_id or _rid(),
        )
        return self.call("Step", request)


def _rid() -> str:
    return uuid.uuid4().hex


def _expect_code(got: tuple[grpc.StatusCode, str], want: grpc.StatusCode, what: str) -> None:
    expect(got[0] == want, f"{what}: expected {want.name}, got {got[0].name} ({got[1]!r})")


def _play(t: Target, seed: int, actions: list[str]) -> list[tuple[str, float, bool, bool]]:
    session = t.open()
    first = t.reset(session, seed)
    trace: list[tuple[str, float, bool, bool]] = [(first.observation, 0.0, False, False)]
    for i, text in enumerate(actions):
        out = t.step(session, first.episode_id, i, text)
        trace.append((out.observation, out.reward, out.terminated, out.truncated))
        if out.terminated or out.truncated:
            break
    t.call("CloseSession", pb.CloseSessionRequest(session_id=session))
    return trace


# -- the checks ------------------------------------------------------------------------------------------


def check_health(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    health = health_pb2_grpc.HealthStub(t.channel)
    for name in ("", SERVICE):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=t.timeout).status
        expect(status == health_pb2.HealthCheckResponse.SERVING, f"health of {name!r} is {status}, not SERVING")


def check_reflection(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    services = ProtoReflectionDescriptorDatabase(t.channel).get_services()
    expect(SERVICE in services, f"reflection lists {list(services)}, not {SERVICE}")


def check_server_info(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    info = t.call("GetServerInfo", pb.GetServerInfoRequest())
    expect(info.protocol_version == "v1", f"protocol_version is {info.protocol_version!r}, not 'v1'")
    expect(t.env_id in info.env_ids, f"env_ids {list(info.env_ids)} lacks {t.env_id!r}")
    expect(info.max_sessions > 0 and info.server_id != "", "max_sessions and server_id must be set")


def check_spec(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    expect(spec.env_id == t.env_id, f"spec.env_id is {spec.env_id!r}")
    expect(spec.max_steps > 0, "spec.max_steps must be > 0")
    expect(spec.reward_min <= spec.reward_max, "spec.reward_min > spec.reward_max")
    expect(bool(spec.instruction and spec.action_format and spec.example_action), "instruction/action text empty")
    schema = json.loads(spec.config_schema)
    expect(isinstance(schema, dict) and schema.get("type") == "object", "config_schema is not a JSON object schema")
    created = pb.CreateSessionRequest(env_id=t.env_id, request_id=_rid())
    created.config.update(t.config)
    reply = t.call("CreateSession", created)
    expect(reply.spec.env_id == t.env_id and reply.spec.max_steps == spec.max_steps, "CreateSession spec differs")


def check_bad_requests(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    _expect_code(
        t.refused("CreateSession", pb.CreateSessionRequest(env_id="no-such-env-xyz", request_id=_rid())),
        grpc.StatusCode.NOT_FOUND,
        "unknown env id",
    )
    bad = pb.CreateSessionRequest(env_id=t.env_id, request_id=_rid())
    bad.config.update({**t.config, "conformance_bogus_key": 1})
    code, message = t.refused("CreateSession", bad)
    _expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "unknown config key")
    expect("conformance_bogus_key" in message, f"the error must name the key: {message!r}")
    code, message = t.refused("Reset", pb.ResetRequest(session_id=t.open()))
    _expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "Reset without request_id")
    expect("request_id" in message, f"the error must name request_id: {message!r}")


def check_unknown_session(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    missing = pb.ResetRequest(session_id="no-such-session", seed=1, request_id=_rid())
    _expect_code(t.refused("Reset", missing), grpc.StatusCode.NOT_FOUND, "Reset of an unknown session")
    session = t.open()
    expect(t.call("CloseSession", pb.CloseSessionRequest(session_id=session)).existed, "CloseSession existed=false")
    closed = pb.ResetRequest(session_id=session, seed=1, request_id=_rid())
    _expect_code(t.refused("Reset", closed), grpc.StatusCode.NOT_FOUND, "Reset of a closed session")


def check_determinism(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    actions = [spec.example_action] * 3
    for seed in (0, 7, 2**40 + 3):
        a, b = _play(t, seed, actions), _play(t, seed, actions)
        expect(a == b, f"seed {seed}: two sessions on one server diverged")
        if second is not None:
            expect(a == _play(second, seed, actions), f"seed {seed}: the second server process diverged")
    expect(_play(t, 0, [])[0][0] == t.reset(t.open(), 0).observation, "same seed, different first observation")


def check_step_rules(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    session = t.open()
    fail = grpc.StatusCode.FAILED_PRECONDITION
    _expect_code(t.refused("Step", _step(session, "no-episode", 0)), fail, "Step before Reset")
    episode = t.reset(session, 3).episode_id
    _expect_code(t.refused("Step", _step(session, episode, 1)), fail, "Step with step_index 1 first")
    first = t.step(session, episode, 0, spec.example_action, request_id="conformance-replay")
    again = t.step(session, episode, 0, spec.example_action, request_id="conformance-replay")
    expect(first == again, "a retried Step (same request_id) must replay the same answer")
    _expect_code(t.refused("Step", _step(session, episode, 0)), fail, "a new request for an old step_index")
    _expect_code(t.refused("Step", _step(session, "stale-episode", 1)), fail, "Step naming another episode")
    index = 1
    if first.terminated or first.truncated:  # a one-step episode: try the malformed reply on a fresh one
        episode, index = t.reset(session, 4).episode_id, 0
    garbage = t.step(session, episode, index, "\u2603 not an action at all \u2603")  # a bad reply is a normal step
    expect(garbage.step_index == index, "a malformed reply must be answered as a normal step")


def check_step_after_done(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    session = t.open()
    episode = t.reset(session, 5).episode_id
    for index in range(spec.max_steps + 1):
        out = t.step(session, episode, index, spec.example_action)
        if out.terminated or out.truncated:
            refused = t.refused("Step", _step(session, episode, index + 1))
            _expect_code(refused, grpc.StatusCode.FAILED_PRECONDITION, "Step after the episode ended")
            return
    raise CheckFailed(f"the episode did not end within max_steps={spec.max_steps}")


def check_action_size_limit(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    limit = t.call("GetServerInfo", pb.GetServerInfoRequest()).max_action_bytes
    expect(limit > 0, "ServerInfo.max_action_bytes must be set")
    session = t.open()
    episode = t.reset(session, 1).episode_id
    code, message = t.refused("Step", _step(session, episode, 0, "x" * (limit + 1)))
    _expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "an action over max_action_bytes")


def check_batches(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    good = t.open()
    resets = t.call(
        "BatchReset",
        pb.BatchResetRequest(
            items=[pb.ResetRequest(session_id=s, seed=2, request_id=_rid()) for s in (good, "no-such-session")]
        ),
    ).items
    expect(len(resets) == 2, "BatchReset must answer every item, in order")
    expect(CODE[resets[0].status.code] == grpc.StatusCode.OK, f"good item failed: {resets[0].status.message}")
    expect(CODE[resets[1].status.code] == grpc.StatusCode.NOT_FOUND, "bad item must be NOT_FOUND")
    request = pb.BatchStepRequest(
        items=[
            _step(good, resets[0].episode_id, 0, spec.example_action),
            _step("no-such-session", "e", 0, spec.example_action),
        ]
    )
    steps = t.call("BatchStep", request).items
    expect([CODE[i.status.code] for i in steps] == [grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND], "BatchStep items")
    expect(steps[0].step_index == 0 and steps[0].episode_id == resets[0].episode_id, "BatchStep echoes ids")


def check_stream(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    sessions = [t.open() for _ in range(3)]

    def requests() -> Iterator[pb.StreamRequest]:
        for tag, session in enumerate(sessions):
            yield pb.StreamRequest(tag=tag + 1, reset=pb.ResetRequest(session_id=session, seed=9, request_id=_rid()))

    answers = {a.tag: a.reset for a in t.stub.Stream(requests(), timeout=t.timeout, metadata=t.metadata)}
    expect(sorted(answers) == [1, 2, 3], f"stream answered tags {sorted(answers)}")
    expect(len({a.observation for a in answers.values()}) == 1, "same seed over the stream, different starts")


def check_deadline(t: Target, spec: pb.EnvSpec, second: Target | None) -> None:
    # A Step sent with a 1 µs deadline may expire anywhere: before the server sees it, while it runs, or not at
    # all (timers are coarse and a fast server on loopback can beat them). Whatever happened, the retry with the
    # same request_id must give exactly the answer of an undisturbed episode: the step ran once, or not yet.
    for seed in range(10):
        reference = t.open()
        episode = t.reset(reference, seed).episode_id
        want = t.step(reference, episode, 0, spec.example_action)
        session = t.open()
        episode = t.reset(session, seed).episode_id
        request = _step(session, episode, 0, spec.example_action)
        try:
            t.call("Step", request, timeout=1e-6)
        except grpc.RpcError as err:
            _expect_code((err.code(), err.details() or ""), grpc.StatusCode.DEADLINE_EXCEEDED, "an expired deadline")
        got = t.call("Step", request)
        same = (got.observation, got.reward, got.terminated, got.truncated, got.step_index)
        expect(
            same == (want.observation, want.reward, want.terminated, want.truncated, want.step_index),
            f"seed {seed}: the retry after a deadline differs from an undisturbed step (ran twice or not at all?)",
        )
    check_health(t, spec, second)


CHECKS: dict[str, Callable[[Target, pb.EnvSpec, Target | None], None]] = {
    "health": check_health,
    "reflection": check_reflection,
    "server-info": check_server_info,
    "spec": check_spec,
    "bad-requests": check_bad_requests,
    "unknown-session": check_unknown_session,
    "determinism": check_determinism,
    "step-rules": check_step_rules,
    "step-after-done": check_step_after_done,
    "action-size-limit": check_action_size_limit,
    "batch-partial-failure": check_batches,
    "stream": check_stream,
    "deadline": check_deadline,
}


def _step(session: str, episode: str, index: int, text: str = "x") -> pb.StepRequest:
    return pb.StepRequest(
        session_id=session, episode_id=episode, step_index=index, action=pb.Action(text=text), request_id=_rid()
    )


def run_conformance(
    address: str,
    env_id: str,
    *,
    config: dict[str, Any] | None = None,
    second: str | None = None,
    token: str | None = None,
    report: Callable[[str], None] = print,
) -> dict[str, str]:
    """Run every check; returns check name -> "" (passed) or the failure message."""
    target = Target(address, env_id, dict(config or {}), token)
    other = Target(second, env_id, dict(config or {}), token) if second else None
    describe = pb.DescribeEnvRequest(env_id=env_id)
    describe.config.update(target.config)
    spec = target.call("DescribeEnv", describe)
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            check(target, spec, other)
            results[name] = ""
        except (CheckFailed, grpc.RpcError, ValueError, KeyError) as err:
            detail = f"{err.code().name}: {err.details()}" if isinstance(err, grpc.RpcError) else str(err)
            results[name] = detail or type(err).__name__
        report(f"{'PASS' if not results[name] else 'FAIL'}  {name}{'  ' + results[name] if results[name] else ''}")
    target.channel.close()
    if other is not None:
        other.channel.close()
    return results
