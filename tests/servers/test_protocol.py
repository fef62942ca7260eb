"""The env protocol, spoken raw over gRPC against a real server: ids, ordering, idempotency, faults, per-item status."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.plugin_envs import SlowEnv, _CounterEnv
from support.servers import start_server

from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc


@pytest.fixture
def stub(server):
    with grpc.insecure_channel(server.address) as channel:
        yield pb_grpc.EnvServiceStub(channel)


def create(stub, env_id="frozenlake", config=None, request_id="c1"):
    request = pb.CreateSessionRequest(env_id=env_id, request_id=request_id)
    if config:
        request.config.update(config)
    return stub.CreateSession(request, timeout=10).session_id


def reset(stub, sid, seed=7, rid="r1"):
    return stub.Reset(pb.ResetRequest(session_id=sid, seed=seed, request_id=rid), timeout=10)


def step(stub, sid, ep, index, text="<answer>Down</answer>", rid=None):
    request = pb.StepRequest(
        session_id=sid, episode_id=ep, step_index=index, action=pb.Action(text=text), request_id=rid or f"s{index}"
    )
    return stub.Step(request, timeout=10)


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code(), info.value.details()


def test_episode_happy_path_and_ids(stub):
    sid = create(stub, "sokoban")
    first = reset(stub, sid, seed=11)
    assert first.session_id == sid and first.episode_id and first.seed == 11 and "P" in first.observation
    result = step(stub, sid, first.episode_id, 0, "<answer>Left</answer>")
    assert result.step_index == 0 and result.episode_id == first.episode_id
    assert result.action_valid and result.reward == pytest.approx(-0.1, abs=1e-9) or result.reward > 0
    second = reset(stub, sid, seed=11, rid="r2")
    assert second.episode_id != first.episode_id, "every Reset starts a new server-issued episode id"
    assert second.observation == first.observation, "same seed, same start"


def test_unseeded_reset_reports_the_seed_it_used(stub):
    sid = create(stub)
    drawn = stub.Reset(pb.ResetRequest(session_id=sid, request_id="r"), timeout=10)
    replayed_elsewhere = reset(stub, create(stub, request_id="c2"), seed=drawn.seed)
    assert replayed_elsewhere.observation == drawn.observation


def test_retried_step_is_replayed_not_repeated(server, stub):
    sid = create(stub, "slow", {"max_steps": 10})
    ep = reset(stub, sid).episode_id
    before = SlowEnv.executed_steps
    a = step(stub, sid, ep, 0, "go", rid="same")
    b = step(stub, sid, ep, 0, "go", rid="same")
    assert a == b
    assert SlowEnv.executed_steps == before + 1


def test_retried_reset_and_create_are_replayed(stub):
    sid = create(stub, request_id="dup")
    assert create(stub, request_id="dup") == sid
    a, b = reset(stub, sid, rid="rr"), reset(stub, sid, rid="rr")
    assert a.episode_id == b.episode_id
    step(stub, sid, a.episode_id, 0)
    code, msg = code_of(reset, stub, sid, rid="rr")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale Reset" in msg


def test_out_of_order_and_stale_steps_are_refused(stub):
    sid = create(stub, "slow", {"max_steps": 10})
    ep = reset(stub, sid).episode_id
    code, msg = code_of(step, stub, sid, ep, 1)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "next step" in msg and "is 0" in msg
    step(stub, sid, ep, 0)
    code, msg = code_of(step, stub, sid, ep, 0, rid="another")  # a new request for an old index
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "step_index=0" in msg
    new_ep = reset(stub, sid, rid="r2").episode_id
    code, msg = code_of(step, stub, sid, ep, 1, rid="late")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and ep in msg and new_ep in msg


def test_step_before_reset_and_after_done(stub):
    sid = create(stub, "slow", {"max_steps": 2})
    code, msg = code_of(step, stub, sid, "ep-x", 0)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "Reset" in msg
    ep = reset(stub, sid).episode_id
    step(stub, sid, ep, 0)
    last = step(stub, sid, ep, 1)
    assert last.truncated and not last.terminated
    code, msg = code_of(step, stub, sid, ep, 2)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "truncated" in msg


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"episode_id": "e", "request_id": "r"}, "session_id"),
        ({"session_id": "s", "request_id": "r"}, "episode_id"),
        ({"session_id": "s", "episode_id": "e"}, "request_id"),
    ],
)
def test_malformed_step_names_the_field(stub, request_fields, field):
    code, msg = code_of(stub.Step, pb.StepRequest(**request_fields), timeout=5)
    if field == "session_id":
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in msg
    else:  # the session must exist for the field checks behind it
        sid = create(stub)
        code, msg = code_of(stub.Step, pb.StepRequest(**{**request_fields, "session_id": sid}), timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and field in msg


def test_create_session_errors(stub):
    code, msg = code_of(stub.CreateSession, pb.CreateSessionRequest(env_id="nope", request_id="x"), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg and "sokoban" in msg
    bad = pb.CreateSessionRequest(env_id="sokoban", request_id="y")
    bad.config.update({"dim_rom": [6, 6]})
    code, msg = code_of(stub.CreateSession, bad, timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "config.dim_rom" in msg
    bad = pb.CreateSessionRequest(env_id="sokoban", request_id="z")
    bad.config.update({"num_boxes": "three"})
    code, msg = code_of(stub.CreateSession, bad, timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "num_boxes" in msg
    code, msg = code_of(stub.CreateSession, pb.CreateSessionRequest(env_id="sokoban"), timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in msg


def test_unknown_session_is_not_found(stub):
    code, msg = code_of(stub.Reset, pb.ResetRequest(session_id="s-nope", request_id="r"), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND and "s-nope" in msg
    sid = create(stub)
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5).existed
    assert code_of(reset, stub, sid)[0] == grpc.StatusCode.NOT_FOUND


def test_idle_sessions_expire():
    running = start_server(session_ttl_s=0.2)
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            sid = create(stub)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and stub.GetServerInfo(pb.GetServerInfoRequest()).active_sessions:
                time.sleep(0.05)
            code, msg = code_of(reset, stub, sid)
            assert code == grpc.StatusCode.NOT_FOUND and "expired" in msg
    finally:
        running.stop()


def test_capacity_limit():
    running = start_server(max_sessions=2)
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            first = create(stub, request_id="a")
            create(stub, request_id="b")
            code, msg = code_of(create, stub, request_id="c")
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "full" in msg
            stub.CloseSession(pb.CloseSessionRequest(session_id=first), timeout=5)
            assert create(stub, request_id="d")
    finally:
        running.stop()


def test_oversize_actions_are_refused_cleanly():
    running = start_server(max_action_bytes=1000, max_message_bytes=64 * 1024)
    try:
        with grpc.insecure_channel(running.address, options=[("grpc.max_send_message_length", 1 << 22)]) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            sid = create(stub)
            ep = reset(stub, sid).episode_id
            code, msg = code_of(step, stub, sid, ep, 0, "x" * 1001)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "1001 bytes" in msg
            code, _ = code_of(step, stub, sid, ep, 0, "x" * 200_000)  # beyond the transport's message limit
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert step(stub, sid, ep, 0).step_index == 0, "the session is unharmed"
    finally:
        running.stop()


def test_env_crash_fails_one_item_and_the_server_keeps_serving(stub):
    crashy, healthy = create(stub, "crashy", request_id="a"), create(stub, "frozenlake", request_id="b")
    resets = stub.BatchReset(
        pb.BatchResetRequest(items=[pb.ResetRequest(session_id=s, seed=1, request_id="r") for s in (crashy, healthy)]),
        timeout=10,
    )
    assert [item.status.code for item in resets.items] == [0, 0]
    eps = [item.episode_id for item in resets.items]
    batch = pb.BatchStepRequest(
        items=[
            pb.StepRequest(
                session_id=crashy, episode_id=eps[0], step_index=0, action=pb.Action(text="crash"), request_id="s"
            ),
            pb.StepRequest(
                session_id="s-missing", episode_id="e", step_index=0, action=pb.Action(text="x"), request_id="s"
            ),
            pb.StepRequest(
                session_id=healthy,
                episode_id=eps[1],
                step_index=0,
                action=pb.Action(text="<answer>Up</answer>"),
                request_id="s",
            ),
        ]
    )
    items = stub.BatchStep(batch, timeout=10).items
    assert items[0].status.code == grpc.StatusCode.INTERNAL.value[0] and "boom" in items[0].status.message
    assert items[1].status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert items[2].status.code == 0 and items[2].step_index == 0
    code, msg = code_of(step, stub, crashy, eps[0], 1, "go")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "aborted" in msg
    assert reset(stub, crashy, rid="r2").observation.startswith("seed="), "the crashed session can start over"


def test_deadline_exceeded_work_is_replayable(stub):
    sid = create(stub, "slow", {"delay_s": 0.4, "max_steps": 10})
    ep = reset(stub, sid).episode_id
    before = SlowEnv.executed_steps
    request = pb.StepRequest(session_id=sid, episode_id=ep, step_index=0, action=pb.Action(text="go"), request_id="d")
    code, _ = code_of(stub.Step, request, timeout=0.1)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    replay = stub.Step(request, timeout=10)  # the retry waits on the same session lock, then replays
    assert replay.step_index == 0 and replay.observation.endswith("t=1")
    assert SlowEnv.executed_steps == before + 1, "the step ran exactly once"


def test_batch_items_past_the_deadline_do_not_run(stub):
    sids = [create(stub, "slow", {"delay_s": 0.3}, request_id=f"c{i}") for i in range(4)]
    eps = [reset(stub, s).episode_id for s in sids]
    before = SlowEnv.executed_steps
    batch = pb.BatchStepRequest(
        items=[
            pb.StepRequest(session_id=s, episode_id=e, step_index=0, action=pb.Action(text="go"), request_id="b")
            for s, e in zip(sids, eps, strict=True)
        ]
    )
    code, _ = code_of(stub.BatchStep, batch, timeout=0.45)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(1.0)  # let the batch job finish on the server
    ran = SlowEnv.executed_steps - before
    assert 1 <= ran < 4, f"items after the deadline must be skipped, {ran} ran"
    replay = stub.BatchStep(batch, timeout=10)
    assert all(item.status.code == 0 for item in replay.items)
    assert SlowEnv.executed_steps - before == 4, "the retry ran only the skipped items"


def test_batch_step_carries_resets_with_per_item_status_and_replay(server, stub):
    info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert "batch-mixed" in info.capabilities
    playing, fresh = create(stub, request_id="c1"), create(stub, request_id="c2")
    episode = reset(stub, playing).episode_id
    batch = pb.BatchStepRequest(
        items=[
            pb.StepRequest(
                session_id=playing, episode_id=episode, step_index=0, action=pb.Action(text="bad"), request_id="s0"
            )
        ],
        resets=[
            pb.ResetRequest(session_id=fresh, seed=5, request_id="r1"),
            pb.ResetRequest(session_id="nope", seed=5, request_id="r1"),
        ],
    )
    reply = stub.BatchStep(batch, timeout=10)
    assert [i.status.code for i in reply.items] == [0] and not reply.items[0].action_valid
    assert [r.status.code for r in reply.resets] == [0, grpc.StatusCode.NOT_FOUND.value[0]]
    assert reply.resets[0].session_id == fresh and reply.resets[0].seed == 5 and reply.resets[0].observation
    again = stub.BatchStep(batch, timeout=10)  # a retry replays both kinds, it does not re-run them
    assert again.items[0].observation == reply.items[0].observation
    assert again.resets[0].episode_id == reply.resets[0].episode_id
    assert step(stub, playing, episode, 1).status.code == 0, "the replay did not advance the episode"


def test_stream_path_multiplexes_sessions(stub):
    sids = [create(stub, request_id=f"c{i}") for i in range(3)]

    def requests():
        for tag, sid in enumerate(sids):
            yield pb.StreamRequest(tag=tag, reset=pb.ResetRequest(session_id=sid, seed=5, request_id="r"))
        yield pb.StreamRequest(tag=99, step=pb.StepRequest(session_id="s-missing", request_id="x", episode_id="e"))

    answers = {a.tag: a for a in stub.Stream(requests(), timeout=10)}
    assert sorted(answers) == [0, 1, 2, 99]
    assert len({answers[t].reset.observation for t in range(3)}) == 1, "same seed, same start"
    assert answers[99].step.status.code == grpc.StatusCode.NOT_FOUND.value[0]


def test_server_info_describe_health_and_reflection(server, stub):
    info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert info.protocol_version == "v1" and "sokoban" in info.env_ids and info.max_sessions > 0
    request = pb.DescribeEnvRequest(env_id="sokoban")
    request.config.update({"dim_room": [8, 8], "num_boxes": 2})
    spec = stub.DescribeEnv(request, timeout=5)
    assert spec.env_id == "sokoban" and spec.max_steps > 0 and spec.example_action
    assert list(spec.config["dim_room"]) == [8, 8] and '"num_boxes"' in spec.config_schema
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "roll_lightning.env.v1.EnvService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert "roll_lightning.env.v1.EnvService" in services and "grpc.health.v1.Health" in services


def test_cheap_batches_run_inline_and_slow_ones_on_the_pool(server, stub):
    from env_servers.server.placement import INLINE_BUDGET_S

    service = server.server.service
    sids = [create(stub, request_id=f"c{i}") for i in range(8)]
    eps = {sid: reset(stub, sid).episode_id for sid in sids}
    for index in range(2):
        items = [
            pb.StepRequest(
                session_id=s, episode_id=e, step_index=index, action=pb.Action(text="bad"), request_id=f"{index}"
            )
            for s, e in eps.items()
        ]
        assert all(item.status.code == 0 for item in stub.BatchStep(pb.BatchStepRequest(items=items), timeout=10).items)
    assert service.placement.item_seconds["step"] * len(sids) < INLINE_BUDGET_S, (
        "FrozenLake steps are cheap: run inline"
    )
    slow = create(stub, "slow", {"delay_s": 0.03}, request_id="slow")  # 3 steps lift the average past 5 ms
    episode = reset(stub, slow).episode_id
    for index in range(3):
        item = pb.StepRequest(session_id=slow, episode_id=episode, step_index=index, action=pb.Action(text="go"))
        item.request_id = f"b{index}"
        assert stub.BatchStep(pb.BatchStepRequest(items=[item]), timeout=10).items[0].status.code == 0
    assert service.placement.item_seconds["step"] > INLINE_BUDGET_S, (
        "the average moved up: slow steps go back to the pool"
    )


def test_operator_env_config_sets_defaults_and_guards_server_only_fields():
    running = start_server(env_ids=("frozenlake", "webshop"), env_configs={"frozenlake": {"size": 6}})
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            assert len(reset(stub, create(stub, request_id="a")).observation.splitlines()) == 6
            assert len(reset(stub, create(stub, config={"size": 5}, request_id="b")).observation.splitlines()) == 5
            code, msg = code_of(create, stub, "webshop", {"data_dir": "/etc"}, request_id="c")
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "config.data_dir" in msg and "operator" in msg
    finally:
        running.stop()
    with pytest.raises(ValueError, match="config.sizes"):
        start_server(env_ids=("frozenlake",), env_configs={"frozenlake": {"sizes": 6}})
    with pytest.raises(ValueError, match="'sokoban' is not served"):
        start_server(env_ids=("frozenlake",), env_configs={"sokoban": {}})


async def test_health_is_not_serving_until_the_envs_have_loaded():
    from support.plugin_envs import LOADING

    from env_servers.server import EnvServer, ServerConfig
    from roll_lightning.env_client.client import EnvClient

    LOADING.clear()
    server = EnvServer(ServerConfig(env_ids=("slowload",), port=0))
    starting = asyncio.create_task(server.start())
    while server._server is None:  # listening, not yet loaded
        await asyncio.sleep(0.01)
    client = EnvClient(server.address)
    try:
        for _ in range(3):  # the port is open, the env is still loading
            assert await client.health() == health_pb2.HealthCheckResponse.NOT_SERVING
            await asyncio.sleep(0.05)
        LOADING.set()
        await starting
        assert await client.health() == health_pb2.HealthCheckResponse.SERVING
    finally:
        LOADING.set()
        await client.close()
        await server.drain_and_stop(0.1)


@pytest.mark.parametrize(("env_id", "overlap"), [("slow", False), ("waiting", True)])
def test_a_batch_of_an_env_that_waits_on_io_runs_its_items_at_once(env_id: str, overlap: bool) -> None:
    """A first batch of unknown cost runs as one job; an env that declares ``waits_on_io`` has its items spread
    over the pool's threads, so their waits overlap (the gauge counts steps running at the same moment)."""
    running = start_server(env_ids=(env_id,), workers=4)
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            sessions = [create(stub, env_id, {"delay_s": 0.05}, request_id=f"c{k}") for k in range(8)]
            episodes = [reset(stub, sid).episode_id for sid in sessions]
            _CounterEnv.max_in_step = 0
            items = [
                pb.StepRequest(session_id=sid, episode_id=ep, step_index=0, action=pb.Action(text="go"), request_id="s")
                for sid, ep in zip(sessions, episodes, strict=True)
            ]
            answered = stub.BatchStep(pb.BatchStepRequest(items=items), timeout=30).items
            assert [item.status.code for item in answered] == [0] * 8
            assert (_CounterEnv.max_in_step > 1) == overlap, _CounterEnv.max_in_step
    finally:
        running.stop()
