"""The rules every server follows (the header of protos/roll_lightning/protocol/v1/env.proto), one check each.

Each check takes a `Suite`, raises `CheckFailed` naming what is wrong, and leaves the sessions it opened to the
runner to close.
"""

from __future__ import annotations

import json

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from env_servers.conformance.target import (
    KNOWN_CAPABILITIES,
    SERVICE,
    CheckFailed,
    Skipped,
    Suite,
    Target,
    expect,
    expect_code,
    rid,
    step_request,
)
from roll_lightning.protocol.v1 import env_pb2 as pb

FAIL = grpc.StatusCode.FAILED_PRECONDITION
SERVING = health_pb2.HealthCheckResponse.SERVING


def check_health(s: Suite) -> None:
    health = health_pb2_grpc.HealthStub(s.t.channel)
    for name in ("", SERVICE):
        status = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=s.t.timeout).status
        expect(status == SERVING, f"health Check of {name!r} is {status}, not SERVING")
    watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE), timeout=s.t.timeout)
    try:
        first = next(iter(watch))
        expect(first.status == SERVING, f"health Watch's first answer is {first.status}, not SERVING")
    finally:
        watch.cancel()


def list_services(t: Target) -> tuple[str, list[str]]:
    """The services reflection lists: grpc.reflection.v1 first, then v1alpha (the messages are the same)."""
    failures = []
    for version in ("v1", "v1alpha"):
        method = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
        call = t.channel.stream_stream(
            method,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        try:
            answers = call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=t.timeout)
            reply = next(iter(answers))
            return version, [service.name for service in reply.list_services_response.service]
        except grpc.RpcError as err:
            failures.append(f"{version}: {err.code().name}")
    raise CheckFailed(f"no server reflection (grpc.reflection.v1 or v1alpha): {'; '.join(failures)}")


def check_reflection(s: Suite) -> None:
    version, services = list_services(s.t)
    expect(SERVICE in services, f"reflection ({version}) lists {services}, not {SERVICE}")


def check_server_info(s: Suite) -> None:
    info = s.info
    expect(info.protocol_version == "v1", f"protocol_version is {info.protocol_version!r}, not 'v1'")
    expect(s.t.env_id in info.env_ids, f"env_ids {list(info.env_ids)} lacks {s.t.env_id!r}")
    expect(info.max_sessions > 0 and info.server_id != "", "max_sessions and server_id must be set")
    expect(info.max_action_bytes > 0 and info.session_ttl_s > 0, "max_action_bytes and session_ttl_s must be set")
    if "batch-mixed" in info.capabilities:
        expect("batch" in info.capabilities, "'batch-mixed' implies 'batch', which is not advertised")
    expect(not info.draining, "a server under test must not be draining")
    known = [c for c in info.capabilities if c in KNOWN_CAPABILITIES]
    expect(len(known) == len(set(known)), f"capabilities repeat a name: {list(info.capabilities)}")


def check_spec(s: Suite) -> None:
    spec = s.spec
    expect(spec.env_id == s.t.env_id, f"spec.env_id is {spec.env_id!r}")
    expect(spec.max_steps > 0, "spec.max_steps must be > 0")
    expect(spec.reward_min <= spec.reward_max, "spec.reward_min > spec.reward_max")
    # example_action may be empty: an env with no move that is legal in every episode gives none
    expect(bool(spec.instruction and spec.action_format), "instruction or action_format empty")
    schema = json.loads(spec.config_schema)
    expect(isinstance(schema, dict) and schema.get("type") == "object", "config_schema is not a JSON object schema")
    reply = s.t.call("CreateSession", s.t.create_request())
    s.t.opened.append(reply.session_id)
    expect(reply.spec.env_id == s.t.env_id and reply.spec.max_steps == spec.max_steps, "CreateSession spec differs")


def check_request_id_required(s: Suite) -> None:
    t = s.t
    for method, request in (
        ("CreateSession", t.create_request(request_id="")),
        ("Reset", pb.ResetRequest(session_id=t.open(), seed=1)),
    ):
        code, message = t.refused(method, request)
        expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, f"{method} without request_id")
        expect("request_id" in message, f"{method}: the error must name request_id: {message!r}")
    session = t.open()
    episode = t.reset(session, 1).episode_id
    code, message = t.refused("Step", pb.StepRequest(session_id=session, episode_id=episode, step_index=0))
    expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "Step without request_id")
    expect("request_id" in message, f"Step: the error must name request_id: {message!r}")


def check_bad_requests(s: Suite) -> None:
    t = s.t
    unknown = pb.CreateSessionRequest(env_id="no-such-env-xyz", request_id=rid())
    expect_code(t.refused("CreateSession", unknown), grpc.StatusCode.NOT_FOUND, "unknown env id")
    bad = t.create_request()
    bad.config.update({"conformance_bogus_key": 1})
    code, message = t.refused("CreateSession", bad)
    expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "unknown config key")
    expect("conformance_bogus_key" in message, f"the error must name the key: {message!r}")


def check_unknown_session(s: Suite) -> None:
    t = s.t
    missing = pb.ResetRequest(session_id="no-such-session", seed=1, request_id=rid())
    expect_code(t.refused("Reset", missing), grpc.StatusCode.NOT_FOUND, "Reset of an unknown session")
    session = t.open()
    expect(t.call("CloseSession", pb.CloseSessionRequest(session_id=session)).existed, "CloseSession existed=false")
    closed = pb.ResetRequest(session_id=session, seed=1, request_id=rid())
    expect_code(t.refused("Reset", closed), grpc.StatusCode.NOT_FOUND, "Reset of a closed session")


def check_seeds(s: Suite) -> None:
    t = s.t
    session = t.open()
    for seed in (0, 11, 2**40 + 3):
        got = t.reset(session, seed)
        expect(got.seed == seed, f"Reset(seed={seed}) reports seed {got.seed}")
        expect(got.session_id == session, f"Reset echoes session_id {got.session_id!r}, not {session!r}")
    s.needs_determinism("that an unseeded Reset's reported seed replays its episode (the seeds were echoed)")
    drawn = t.reset(session, None)
    again = t.reset(t.open(), drawn.seed)
    expect(
        again.observation == drawn.observation,
        f"an unseeded Reset reported seed {drawn.seed}, but that seed gives a different first observation",
    )


def check_replay(s: Suite) -> None:
    t = s.t
    created = t.create_request()
    first = t.call("CreateSession", created)
    t.opened.append(first.session_id)
    expect(t.call("CreateSession", created).session_id == first.session_id, "a retried CreateSession made a new one")
    session = first.session_id
    reset = pb.ResetRequest(session_id=session, seed=4, request_id="conformance-reset")
    a, b = t.call("Reset", reset), t.call("Reset", reset)
    expect(a == b, "a retried Reset (same request_id) must replay the same answer (same episode_id)")
    step = step_request(session, a.episode_id, 0, s.spec.example_action, "conformance-step")
    x, y = t.call("Step", step), t.call("Step", step)
    expect(x == y, "a retried Step (same request_id) must replay the same answer")
    expect_code(t.refused("Reset", reset), FAIL, "a retried Reset after its episode took a step (stale)")


def check_replay_scope(s: Suite) -> None:
    """Request ids are per session (the trainer reuses "1", "2", ... in every session)."""
    t = s.t
    a, b = t.open(), t.open()
    ra, rb = t.reset(a, 1, request_id="1"), t.reset(b, 2, request_id="1")
    expect(rb.session_id == b and rb.seed == 2, f"Reset of session B with A's request_id answered {rb.session_id!r}, "
           f"seed {rb.seed}: request ids must be scoped to their session")  # fmt: skip
    expect(ra.episode_id != rb.episode_id, "two sessions' Resets with one request_id got the same episode_id")
    sa = t.step(a, ra.episode_id, 0, s.spec.example_action, request_id="2")
    sb = t.step(b, rb.episode_id, 0, s.spec.example_action, request_id="2")
    expect(
        (sb.session_id, sb.episode_id, sb.step_index) == (b, rb.episode_id, 0),
        f"Step of session B with A's request_id answered session {sb.session_id!r} episode {sb.episode_id!r}",
    )
    expect(sa.episode_id == ra.episode_id, "Step of session A answered another episode")


def play(t: Target, seed: int, actions: list[str]) -> list[tuple[str, float, bool, bool]]:
    session = t.open()
    first = t.reset(session, seed)
    trace: list[tuple[str, float, bool, bool]] = [(first.observation, 0.0, False, False)]
    for i, text in enumerate(actions):
        out = t.step(session, first.episode_id, i, text)
        trace.append((out.observation, out.reward, out.terminated, out.truncated))
        if out.terminated or out.truncated:
            break
    return trace


def check_determinism(s: Suite) -> None:
    s.needs_determinism("that one seed plays the same episode twice")
    actions = [s.spec.example_action] * 3
    for seed in (0, 7, 2**40 + 3):
        a, b = play(s.t, seed, actions), play(s.t, seed, actions)
        expect(a == b, f"seed {seed}: two sessions on one server diverged")
        if s.second is not None:
            expect(a == play(s.second, seed, actions), f"seed {seed}: the second server process diverged")
            s.second.close_opened()


def check_step_rules(s: Suite) -> None:
    t = s.t
    session = t.open()
    expect_code(t.refused("Step", step_request(session, "no-episode", 0)), FAIL, "Step before Reset")
    old = t.reset(session, 3)
    episode = t.reset(session, 3).episode_id
    expect(old.episode_id != episode, "two Resets gave the same episode_id")
    expect_code(t.refused("Step", step_request(session, old.episode_id, 0)), FAIL, "Step naming the previous episode")
    expect_code(t.refused("Step", step_request(session, episode, 1)), FAIL, "Step with step_index 1 first")
    first = t.step(session, episode, 0, s.spec.example_action)
    expect(
        (first.session_id, first.episode_id, first.step_index) == (session, episode, 0),
        f"Step must echo session_id, episode_id and step_index; got {first.session_id!r}, {first.episode_id!r}, "
        f"{first.step_index}",
    )
    expect_code(t.refused("Step", step_request(session, episode, 0)), FAIL, "a new request for an old step_index")


def check_garbage_reply(s: Suite) -> None:
    if not s.garbage:
        raise Skipped("no --garbage reply given (this env accepts any text)")
    t = s.t
    session = t.open()
    episode = t.reset(session, 5).episode_id
    out = t.step(session, episode, 0, s.garbage)  # an RPC error here fails the check: it must be a normal step
    expect(out.step_index == 0, "a malformed reply must be answered as a normal step")
    expect(not out.action_valid, f"the reply {s.garbage!r} was answered action_valid=true")
    spec = s.spec
    expect(spec.reward_min <= out.reward <= spec.reward_max, f"penalty {out.reward} outside the spec's reward bounds")
    if not (out.terminated or out.truncated):
        t.step(session, episode, 1, s.spec.example_action)  # the episode goes on


def check_step_after_done(s: Suite) -> None:
    t = s.t
    session = t.open()
    episode = t.reset(session, 5).episode_id
    for index in range(s.spec.max_steps + 1):
        out = t.step(session, episode, index, s.spec.example_action)
        if out.terminated or out.truncated:
            refused = t.refused("Step", step_request(session, episode, index + 1))
            expect_code(refused, FAIL, "Step after the episode ended")
            return
    raise CheckFailed(f"the episode did not end within max_steps={s.spec.max_steps}")


def check_action_size_limit(s: Suite) -> None:
    t = s.t
    session = t.open()
    episode = t.reset(session, 1).episode_id
    code, message = t.refused("Step", step_request(session, episode, 0, "x" * (s.info.max_action_bytes + 1)))
    expect_code((code, message), grpc.StatusCode.INVALID_ARGUMENT, "an action over max_action_bytes")


def check_deadline(s: Suite) -> None:
    # A 1 µs deadline may expire anywhere, or not at all; either way the retry must give exactly the undisturbed
    # answer (the step ran once, or not yet).
    s.needs_determinism("that a step retried after its deadline equals an undisturbed step of the same seed")
    t = s.t
    for seed in range(10):
        reference = t.open()
        episode = t.reset(reference, seed).episode_id
        want = t.step(reference, episode, 0, s.spec.example_action)
        session = t.open()
        episode = t.reset(session, seed).episode_id
        request = step_request(session, episode, 0, s.spec.example_action)
        try:
            t.call("Step", request, timeout=1e-6)
        except grpc.RpcError as err:
            expect_code((err.code(), err.details() or ""), grpc.StatusCode.DEADLINE_EXCEEDED, "an expired deadline")
        got = t.call("Step", request)
        same = (got.observation, got.reward, got.terminated, got.truncated, got.step_index)
        expect(
            same == (want.observation, want.reward, want.terminated, want.truncated, want.step_index),
            f"seed {seed}: the retry after a deadline differs from an undisturbed step (ran twice or not at all?)",
        )
        t.close_opened()
    check_health(s)
