"""The image rules (env.proto's header, "Images"), checked on servers that advertise "images".

Every answer of a few seeded episodes, over each advertised RPC, must keep them, and the same seed must give
the same image bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from env_servers.conformance.target import CODE, Suite, expect, rid, step_request
from env_servers.images import image_rule_broken
from roll_lightning.protocol.v1 import env_pb2 as pb

MAX_STEPS = 10
SEEDS = (0, 7, 2**40 + 3)

Trace = list[tuple[str, tuple[tuple[str, bytes], ...]]]  # per answer: text, ((media type, data), ...)


def _record(trace: Trace, where: str, answer: Any) -> None:
    expect(answer.status.code == 0, f"{where} failed: {CODE[answer.status.code].name} {answer.status.message}")
    broken = image_rule_broken(answer.observation, answer.images)
    expect(broken is None, f"{where}: the observation breaks an image rule: {broken}")
    trace.append((answer.observation, tuple((image.media_type, image.data) for image in answer.images)))


def _play_unary(s: Suite, seed: int, target: Any = None) -> Trace:
    t = target or s.t
    session, trace = t.open(), []
    first = t.reset(session, seed)
    _record(trace, f"seed {seed}: Reset", first)
    for i in range(min(s.spec.max_steps, MAX_STEPS)):
        out = t.step(session, first.episode_id, i, s.spec.example_action)
        _record(trace, f"seed {seed}: step {i}", out)
        if out.terminated or out.truncated:
            break
    return trace


def _play_batched(s: Suite, seed: int) -> Trace:
    """The same episode over BatchReset and BatchStep, one item each."""
    t, trace = s.t, []
    session = t.open()
    reset = pb.ResetRequest(session_id=session, seed=seed, request_id=rid())
    (first,) = t.call("BatchReset", pb.BatchResetRequest(items=[reset])).items
    _record(trace, f"seed {seed}: BatchReset", first)
    for i in range(min(s.spec.max_steps, MAX_STEPS)):
        step = step_request(session, first.episode_id, i, s.spec.example_action)
        (out,) = t.call("BatchStep", pb.BatchStepRequest(items=[step])).items
        _record(trace, f"seed {seed}: BatchStep {i}", out)
        if out.terminated or out.truncated:
            break
    return trace


def _stream_start(s: Suite, seed: int) -> Trace:
    t, trace = s.t, []
    session = t.open()

    def requests() -> Iterator[pb.StreamRequest]:
        yield pb.StreamRequest(tag=1, reset=pb.ResetRequest(session_id=session, seed=seed, request_id=rid()))

    (answer,) = list(t.stub.Stream(requests(), timeout=t.timeout, metadata=t.metadata))
    _record(trace, f"seed {seed}: a Reset over the stream", answer.reset)
    return trace


def check_images(s: Suite) -> None:
    s.needs("images")
    capabilities = set(s.info.capabilities)
    for seed in SEEDS:
        a = _play_unary(s, seed)
        if not s.spec.deterministic:
            continue
        expect(a == _play_unary(s, seed), f"seed {seed}: two sessions on one server sent different images")
        if s.second is not None:
            expect(a == _play_unary(s, seed, s.second), f"seed {seed}: the second server process sent other images")
        if "batch" in capabilities:
            expect(a == _play_batched(s, seed), f"seed {seed}: the batched calls sent other images than the unary")
        if "stream" in capabilities:
            expect(a[:1] == _stream_start(s, seed), f"seed {seed}: the stream's Reset sent other images")
        s.t.close_opened()
