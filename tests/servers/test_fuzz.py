"""Fuzzed requests (hypothesis) and raw garbage bytes: the server answers every one and never dies."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

# What a refusal may look like; UNKNOWN would mean an unhandled exception in the server.
EXPECTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
CODES = {code.value[0]: code for code in grpc.StatusCode}

texts = st.text(max_size=300) | st.sampled_from(["<answer>Up</answer>", "<answer>left</answer>", "", "go"])
json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
configs = st.dictionaries(
    st.sampled_from(["dim_room", "num_boxes", "max_steps", "size", "frozen_prob", "is_slippery", "bogus"]),
    json_values | st.integers(-5, 40) | st.lists(st.integers(-2, 40), max_size=3),
    max_size=3,
)


@pytest.fixture(scope="module")
def fuzz_server():
    from support.servers import start_server

    running = start_server(env_ids=("sokoban", "frozenlake"), max_sessions=64, max_action_bytes=256)
    with grpc.insecure_channel(running.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sessions = []
        for i, env_id in enumerate(("sokoban", "frozenlake")):
            sid = stub.CreateSession(
                pb.CreateSessionRequest(env_id=env_id, request_id=f"seed-{i}"), timeout=10
            ).session_id
            episode = stub.Reset(pb.ResetRequest(session_id=sid, seed=1, request_id="r"), timeout=10).episode_id
            sessions.append((sid, episode))
        yield running, channel, stub, sessions
    running.stop()


def _call(fn, request):
    try:
        fn(request, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    env_id=st.sampled_from(["sokoban", "frozenlake", "", "nope"]) | st.text(max_size=12),
    config=configs,
    pick=st.integers(0, 2),
    session_text=st.text(max_size=30),
    use_real_episode=st.booleans(),
    step_index=st.integers(0, 2**32 - 1),
    action=texts,
    request_id=st.text(max_size=20),
    seed=st.none() | st.integers(0, 2**64 - 1),
    options=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
)
def test_fuzzed_requests_get_clean_answers(
    fuzz_server, env_id, config, pick, session_text, use_real_episode, step_index, action, request_id, seed, options
):
    _, _, stub, sessions = fuzz_server
    session_id, episode_id = sessions[pick] if pick < 2 else (session_text, session_text)
    episode_id = episode_id if use_real_episode else session_text
    create = pb.CreateSessionRequest(env_id=env_id, request_id=request_id)
    create.config.update(config)
    code = _call(stub.CreateSession, create)
    assert code in EXPECTED
    if code == grpc.StatusCode.OK:
        stub.CloseSession(pb.CloseSessionRequest(session_id=stub.CreateSession(create, timeout=10).session_id))
    describe = pb.DescribeEnvRequest(env_id=env_id)
    describe.config.update(config)
    assert _call(stub.DescribeEnv, describe) in EXPECTED
    step = pb.StepRequest(
        session_id=session_id,
        episode_id=episode_id,
        step_index=step_index,
        action=pb.Action(text=action),
        request_id=request_id,
    )
    assert _call(stub.Step, step) in EXPECTED
    reset = pb.ResetRequest(session_id=session_text, request_id=request_id, options=None)
    if seed is not None:
        reset.seed = seed
    reset.options.update(options)
    assert _call(stub.Reset, reset) in EXPECTED
    batch = stub.BatchStep(pb.BatchStepRequest(items=[step, step]), timeout=10)
    assert all(CODES[item.status.code] in EXPECTED for item in batch.items)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=512), method=st.sampled_from(["Step", "BatchStep", "CreateSession", "Reset"]))
def test_garbage_bytes_do_not_kill_the_server(fuzz_server, payload, method):
    _, channel, stub, _ = fuzz_server
    raw = channel.unary_unary(f"/roll_lightning.env.v1.EnvService/{method}")  # bytes in, bytes out
    try:
        raw(payload, timeout=10)
    except grpc.RpcError as err:
        assert err.code() in EXPECTED, err.details()
    assert stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10).protocol_version == "v1"
