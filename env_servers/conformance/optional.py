"""Rules that apply only to some servers: advertised capabilities, and rules the suite can check only when told
how (small capacity or TTL, a crashing action, the token, a launched server). Otherwise a check is `Skipped`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from env_servers.conformance.target import (
    CODE,
    SERVICE,
    CheckFailed,
    Skipped,
    Suite,
    expect,
    expect_code,
    rid,
    step_request,
)
from roll_lightning.protocol.v1 import env_pb2 as pb

MAX_FILL = 64  # the capacity rule opens at most this many sessions
MAX_TTL_S = 5.0  # the reaping rule waits out at most this TTL
OK, NOT_FOUND, INVALID = grpc.StatusCode.OK, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT


def _codes(items: object) -> list[grpc.StatusCode]:
    return [CODE[item.status.code] for item in items]  # type: ignore[attr-defined]


def check_batches(s: Suite) -> None:
    s.needs("batch")
    t = s.t
    good = t.open()
    items = [pb.ResetRequest(session_id=x, seed=2, request_id=rid()) for x in (good, "no-such-session")]
    resets = t.call("BatchReset", pb.BatchResetRequest(items=items)).items
    expect(len(resets) == 2, "BatchReset must answer every item, in order")
    expect(_codes(resets) == [OK, NOT_FOUND], f"BatchReset item codes {_codes(resets)}, want [OK, NOT_FOUND]")
    expect(resets[0].session_id == good and resets[0].seed == 2, "BatchReset must echo session_id and seed")
    steps = [
        step_request(good, resets[0].episode_id, 0, s.spec.example_action),
        step_request("no-such-session", "e", 0, s.spec.example_action),
    ]
    answers = t.call("BatchStep", pb.BatchStepRequest(items=steps)).items
    expect(_codes(answers) == [OK, NOT_FOUND], f"BatchStep item codes {_codes(answers)}, want [OK, NOT_FOUND]")
    expect(answers[0].step_index == 0 and answers[0].episode_id == resets[0].episode_id, "BatchStep echoes ids")


def check_batch_mixed(s: Suite) -> None:
    s.needs("batch-mixed")
    t = s.t
    stepping, fresh = t.open(), t.open()
    episode = t.reset(stepping, 3).episode_id
    request = pb.BatchStepRequest(
        items=[step_request(stepping, episode, 0, s.spec.example_action)],
        resets=[
            pb.ResetRequest(session_id=fresh, seed=6, request_id=rid()),
            pb.ResetRequest(session_id="no-such-session", seed=6, request_id=rid()),
        ],
    )
    reply = t.call("BatchStep", request)
    expect(len(reply.items) == 1 and len(reply.resets) == 2, "BatchStep with resets must answer both lists")
    expect(_codes(reply.items) == [OK], f"the step item failed: {reply.items[0].status.message}")
    expect(_codes(reply.resets) == [OK, NOT_FOUND], f"reset item codes {_codes(reply.resets)}, want [OK, NOT_FOUND]")
    if s.spec.deterministic:  # otherwise the same seed may start another episode by design
        plain = t.reset(t.open(), 6)
        expect(reply.resets[0].observation == plain.observation, "a reset inside BatchStep started another episode")


def check_stream(s: Suite) -> None:
    s.needs("stream")
    t = s.t
    sessions = [t.open() for _ in range(3)]
    first = {tag + 1: t.reset(x, 9) for tag, x in enumerate(sessions)}

    def requests() -> Iterator[pb.StreamRequest]:
        for tag, session in enumerate(sessions, start=1):
            yield pb.StreamRequest(tag=tag, reset=pb.ResetRequest(session_id=session, seed=9, request_id=rid()))
        yield pb.StreamRequest(tag=10, step=step_request("no-such-session", "e", 0))
        yield pb.StreamRequest(tag=11)  # neither reset nor step
        yield pb.StreamRequest(tag=12, reset=pb.ResetRequest(session_id=sessions[0], seed=9, request_id=rid()))

    answers = {a.tag: a for a in t.stub.Stream(requests(), timeout=t.timeout, metadata=t.metadata)}
    expect(sorted(answers) == [1, 2, 3, 10, 11, 12], f"the stream answered tags {sorted(answers)}")
    for tag in (1, 2, 3):
        got = answers[tag].reset
        expect(CODE[got.status.code] == OK, f"stream reset {tag} failed: {got.status.message}")
        same = got.observation == first[tag].observation or not s.spec.deterministic
        expect(same, "same seed over the stream, a different start")
    missing = answers[10].step
    expect(CODE[missing.status.code] == NOT_FOUND, "a stream step of an unknown session must carry NOT_FOUND")
    empty = answers[11]
    kind = empty.WhichOneof("result")
    code = CODE[getattr(empty, kind).status.code] if kind else None
    expect(kind == "step" and code == INVALID, f"a request with neither reset nor step: got {kind} {code}")
    expect(CODE[answers[12].reset.status.code] == OK, "the stream must go on after a request with neither field")
    episode = answers[12].reset.episode_id

    def steps() -> Iterator[pb.StreamRequest]:
        yield pb.StreamRequest(tag=1, step=step_request(sessions[0], episode, 0, s.spec.example_action))

    (stepped,) = list(t.stub.Stream(steps(), timeout=t.timeout, metadata=t.metadata))
    expect(CODE[stepped.step.status.code] == OK and stepped.step.episode_id == episode, "a stream step failed")


def check_capacity(s: Suite) -> None:
    t = s.t
    info = t.info()
    free = info.max_sessions - info.active_sessions
    if free > MAX_FILL:
        raise Skipped(
            f"max_sessions={info.max_sessions}: start the server with at most {MAX_FILL} sessions to check it"
        )
    for _ in range(free):
        t.open()
    code, message = t.refused("CreateSession", t.create_request())
    expect_code((code, message), grpc.StatusCode.RESOURCE_EXHAUSTED, f"CreateSession with {free} sessions open")
    t.close_opened()
    t.open()  # closing frees the capacity again


def check_idle_reaping(s: Suite) -> None:
    t = s.t
    ttl = s.info.session_ttl_s
    if ttl > MAX_TTL_S:
        raise Skipped(f"session_ttl_s={ttl:g}: start the server with a TTL of at most {MAX_TTL_S:g}s to check it")
    session = t.open()
    t.reset(session, 1)
    time.sleep(ttl * 1.5 + 1.0)  # any call on the session would keep it alive: wait without touching it
    code = t.refused("Reset", pb.ResetRequest(session_id=session, seed=1, request_id=rid()))
    expect_code(code, NOT_FOUND, f"a session idle for {ttl * 1.5 + 1:.1f}s (TTL {ttl:g}s)")


def check_env_crash(s: Suite) -> None:
    if s.crash_action is None:
        raise Skipped("no --crash-action given (an action that makes the env raise)")
    t = s.t
    session = t.open()
    episode = t.reset(session, 1).episode_id
    code = t.refused("Step", step_request(session, episode, 0, s.crash_action))
    expect_code(code, grpc.StatusCode.INTERNAL, "a step whose env raised")
    expect_code(t.refused("Step", step_request(session, episode, 1)), grpc.StatusCode.FAILED_PRECONDITION,
                "a step of the aborted episode")  # fmt: skip
    t.reset(session, 2)  # the session survives
    expect(t.info().server_id == s.info.server_id, "the server restarted")


def check_auth(s: Suite) -> None:
    if not s.t.token:
        raise Skipped("no --token given (the server runs without one, or the suite was not told it)")
    t = s.t
    for what, metadata in (("without a token", None), ("with a wrong token", (("authorization", "Bearer wrong"),))):
        code = t.refused("GetServerInfo", pb.GetServerInfoRequest(), metadata=metadata)
        expect_code(code, grpc.StatusCode.UNAUTHENTICATED, f"a call {what}")


def check_loading(s: Suite) -> None:
    if s.launched is None:
        raise Skipped("the server was not started by the suite (--launch)")
    bad = [state for state in s.loading_states if state not in ("unreachable", "NOT_SERVING", "SERVING")]
    expect(not bad, f"while starting, health answered {bad} (only NOT_SERVING until loaded, then SERVING)")
    expect(s.loading_states[-1:] == ["SERVING"], f"health never became SERVING: {s.loading_states[-5:]}")


def check_drain(s: Suite) -> None:
    """Last: SIGTERM the server, then check the drain rule and that the process exits."""
    if s.launched is None:
        raise Skipped("the server was not started by the suite (--launch): the drain rule needs to SIGTERM it")
    t = s.t
    playing, idle = t.open(), t.open()
    episode = t.reset(playing, 1).episode_id
    t.step(playing, episode, 0, s.spec.example_action)
    s.launched.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    status = health_pb2_grpc.HealthStub(t.channel).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5)
    expect(status.status == health_pb2.HealthCheckResponse.NOT_SERVING, f"draining, health is {status.status}")
    expect(t.info().draining, "draining, ServerInfo.draining is false")
    for what, method, request in (
        ("CreateSession", "CreateSession", t.create_request()),
        ("a new Reset", "Reset", pb.ResetRequest(session_id=idle, seed=1, request_id=rid())),
    ):
        code, message = t.refused(method, request, timeout=5)
        expect_code((code, message), grpc.StatusCode.UNAVAILABLE, f"{what} while draining")
        expect(message.startswith("draining"), f"{what} while draining: the message must start 'draining': {message!r}")
    for index in range(1, s.spec.max_steps + 1):
        try:
            out = t.step(playing, episode, index, s.spec.example_action)
        except grpc.RpcError as err:
            raise CheckFailed(f"step {index} of an episode in progress was refused while draining: "
                              f"{err.code().name} {err.details()}") from err  # fmt: skip
        if out.terminated or out.truncated:
            break
    else:
        t.call("CloseSession", pb.CloseSessionRequest(session_id=playing))
    t.opened.clear()
    deadline = time.monotonic() + 15
    while s.launched.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    expect(s.launched.poll() is not None, "the server was still running 15 s after its last episode ended")
