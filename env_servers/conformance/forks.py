"""The Fork rules of env.proto (capability "fork"): a copy steps exactly as the original would, copies are
independent of the original and of each other, a retried fork makes no new sessions, forks that cannot be made
are refused with a named status, and copies are sessions like any other. Each rule skips on a server that does
not advertise "fork"; the exact and independent rules also skip an env that declares deterministic: false.
"""

from __future__ import annotations

from typing import Any

import grpc

from env_servers.conformance.target import Skipped, Suite, Target, expect, expect_code, rid
from roll_lightning.protocol.v1 import env_pb2 as pb

SEED = 11
FAIL, INVALID = grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT


def fork(t: Target, session_id: str, copies: int, request_id: str | None = None) -> pb.ForkSessionResponse:
    request = pb.ForkSessionRequest(session_id=session_id, copies=copies, request_id=request_id or rid())
    answer = t.call("ForkSession", request)
    t.opened.extend(f.session_id for f in answer.forks)
    return answer


def answer_of(out: pb.StepResult) -> tuple[Any, ...]:
    """What a copy must answer exactly as the original: not its ids, info or metrics (which may time things)."""
    images = tuple((i.data, i.media_type) for i in out.images)
    tools = tuple((r.call_id, r.name, r.content, r.is_error) for r in out.tool_results)
    return out.observation, out.reward, out.terminated, out.truncated, out.action_valid, images, tools


def actions(s: Suite, first: str, other: str) -> list[str]:
    """A run of actions that mixes two replies, long enough to reach the episode's end."""
    return [first if k % 3 != 2 else other for k in range(s.spec.max_steps + 1)]


def play_on(t: Target, session_id: str, episode_id: str, start: int, texts: list[str]) -> list[tuple[Any, ...]]:
    """Step one session from ``start`` until its episode ends or ``texts`` run out; its answers."""
    answers = []
    for k, text in enumerate(texts):
        out = t.step(session_id, episode_id, start + k, text)
        expect(
            (out.session_id, out.episode_id, out.step_index) == (session_id, episode_id, start + k),
            f"a copy's Step must echo its own session_id, episode_id and step_index; got {out.session_id!r}, "
            f"{out.episode_id!r}, {out.step_index}",
        )
        answers.append(answer_of(out))
        if out.terminated or out.truncated:
            break
    return answers


def started(s: Suite) -> tuple[str, str, int]:
    """A session reset on `SEED` with one step taken (unless that step ends the episode): its ids and next step."""
    t = s.t
    session = t.open()
    episode = t.reset(session, SEED).episode_id
    out = t.step(session, episode, 0, s.spec.example_action)
    if out.terminated or out.truncated:
        episode = t.reset(session, SEED).episode_id
        return session, episode, 0
    return session, episode, 1


def needs_fork(s: Suite) -> None:
    s.needs("fork")
    if not s.spec.forkable:
        raise Skipped(f"env {s.spec.env_id!r} says forkable: false (the fork-refused rule checks its refusal)")


def check_fork_exact(s: Suite) -> None:
    needs_fork(s)
    s.needs_determinism("that a copy answers as the original")
    t = s.t
    session, episode, index = started(s)
    answer = fork(t, session, 2)
    copies = [(f.session_id, f.episode_id) for f in answer.forks]
    expect(len(copies) == 2, f"ForkSession(copies=2) answered {len(copies)} copies")
    ids = {session, *(c[0] for c in copies)}
    expect(len(ids) == 3 and episode not in {c[1] for c in copies}, "each copy needs its own session and episode id")
    expect(answer.step_index == index, f"the copies' step_index is {answer.step_index}, the original's next is {index}")
    texts = actions(s, s.spec.example_action, s.garbage or "x")
    # The original runs to the end first: a copy sharing its state or RNG with it then answers otherwise.
    original = play_on(t, session, episode, index, texts)
    for k, (copy_id, copy_episode) in enumerate(copies):
        copied = play_on(t, copy_id, copy_episode, index, texts)
        differs = next((n for n, pair in enumerate(zip(copied, original, strict=False)) if pair[0] != pair[1]), None)
        expect(
            copied == original,
            f"copy {k} answered otherwise than the original given the same actions (from step "
            f"{index + (min(len(copied), len(original)) if differs is None else differs)})",
        )


def check_fork_independent(s: Suite) -> None:
    needs_fork(s)
    s.needs_determinism("that copies answer alike")
    t = s.t
    texts = actions(s, s.spec.example_action, s.garbage or "x")
    session, episode, index = started(s)
    reference_session, reference_episode, _ = started(s)  # the same start, never forked
    reference = play_on(t, reference_session, reference_episode, index, texts)
    (a, a_ep), (b, b_ep), (c, c_ep) = [(f.session_id, f.episode_id) for f in fork(t, session, 3).forks]
    play_on(t, a, a_ep, index, actions(s, s.garbage or "x", s.spec.example_action))  # copy a goes its own way
    t.reset(a, SEED + 1)
    t.call("CloseSession", pb.CloseSessionRequest(session_id=session))  # the original is gone
    b_answers, c_answers = [], []
    for k, text in enumerate(texts):  # b and c step in turn: shared state or RNG between them shows
        for sid, eid, out in ((b, b_ep, b_answers), (c, c_ep, c_answers)):
            if not (out and (out[-1][2] or out[-1][3])):
                out.extend(play_on(t, sid, eid, index + k, [text]))
    expect(b_answers == reference, "a copy answered otherwise after the original closed and another copy stepped")
    expect(c_answers == reference, "two copies stepped in turn answered otherwise than an unforked session")


def check_fork_retry(s: Suite) -> None:
    needs_fork(s)
    t = s.t
    session, _, _ = started(s)
    before = t.info().active_sessions
    request_id = rid()
    first = [f.session_id for f in fork(t, session, 2, request_id).forks]
    again = [f.session_id for f in fork(t, session, 2, request_id).forks]
    expect(first == again, f"a retried fork (same request_id) answered other copies: {first} then {again}")
    made = t.info().active_sessions - before
    expect(made == 2, f"a fork of 2 copies, retried once, left {made} new sessions")


def check_fork_refused(s: Suite) -> None:
    s.needs("fork")
    t = s.t
    session = t.open()
    if not s.spec.forkable:
        t.reset(session, SEED)
        got = t.refused("ForkSession", pb.ForkSessionRequest(session_id=session, copies=1, request_id=rid()))
        expect_code(got, FAIL, "a fork of an env with forkable: false")
        return
    request = pb.ForkSessionRequest(session_id=session, copies=1, request_id=rid())
    expect_code(t.refused("ForkSession", request), FAIL, "a fork of a session never reset")
    episode = t.reset(session, SEED).episode_id
    for copies in (0, 65):
        bad = pb.ForkSessionRequest(session_id=session, copies=copies, request_id=rid())
        expect_code(t.refused("ForkSession", bad), INVALID, f"a fork of {copies} copies")
    no_id = pb.ForkSessionRequest(session_id=session, copies=1)
    expect_code(t.refused("ForkSession", no_id), INVALID, "a fork without request_id")
    unknown = pb.ForkSessionRequest(session_id="no-such-session", copies=1, request_id=rid())
    expect_code(t.refused("ForkSession", unknown), grpc.StatusCode.NOT_FOUND, "a fork of an unknown session")
    for index in range(s.spec.max_steps + 1):
        out = t.step(session, episode, index, s.spec.example_action)
        if out.terminated or out.truncated:
            request = pb.ForkSessionRequest(session_id=session, copies=1, request_id=rid())
            expect_code(t.refused("ForkSession", request), FAIL, "a fork of a session whose episode ended")
            return
    expect(False, f"the episode did not end within max_steps={s.spec.max_steps}")


def check_fork_sessions(s: Suite) -> None:
    needs_fork(s)
    t = s.t
    session, _, index = started(s)
    before = t.info().active_sessions
    (one,) = fork(t, session, 1).forks
    (grandchild,) = fork(t, one.session_id, 1).forks  # a copy forks like any session
    expect(t.info().active_sessions == before + 2, "copies must count in active_sessions")
    out = t.step(grandchild.session_id, grandchild.episode_id, index, s.spec.example_action)
    expect(out.step_index == index, "a copy of a copy continues at the same step_index")
    closed = t.call("CloseSession", pb.CloseSessionRequest(session_id=one.session_id))
    expect(closed.existed, "CloseSession of a copy must say it existed")
    expect(t.info().active_sessions == before + 1, "a closed copy must leave active_sessions")
