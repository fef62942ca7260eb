"""Images in observations (env.proto, "Images") through real servers on 127.0.0.1.

The `pictures` env (tests/support/image_envs.py) sends PNGs with every observation: they arrive intact over
Reset, Step, BatchReset, BatchStep (with resets) and the Stream, and in the client's outcomes; text-only envs
are unchanged; an observation breaking an image rule is never sent (INTERNAL naming the rule); the client
refuses an answer whose markers and images disagree; the conformance suite passes; and a few thousand image
episodes leave the replay caches holding only each session's latest answers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import support.image_envs  # noqa: F401  (registers `pictures`)
from support.conformance import conforms
from support.image_envs import BROKEN, board_png
from support.misbehaving import start_misbehaving
from support.servers import start_server

from env_servers.conformance import run_conformance
from env_servers.server import RunningServer
from env_servers.server.service import EnvService
from roll_lightning.env_client import EnvPool, ObservationImage, ProtocolViolation
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

ENVS = ("pictures", "frozenlake")


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(env_ids=ENVS, max_sessions=64, session_ttl_s=60)
    yield server
    server.stop()


@pytest.fixture
def stub(running: RunningServer) -> Iterator[pb_grpc.EnvServiceStub]:
    with grpc.insecure_channel(running.address) as channel:
        yield pb_grpc.EnvServiceStub(channel)


def rid() -> str:
    return uuid.uuid4().hex


def open_session(stub: pb_grpc.EnvServiceStub, env_id: str = "pictures", **config: Any) -> str:
    request = pb.CreateSessionRequest(env_id=env_id, request_id=rid())
    request.config.update(config)
    return stub.CreateSession(request, timeout=10).session_id


def expected(seed: int, t: int, count: int = 1) -> list[tuple[bytes, str]]:
    """The images `pictures` shows after ``t`` steps of episode ``seed``."""
    return [(board_png(seed, t * 16 + k, 8), "image/png") for k in range(count)]


def pairs(answer: Any) -> list[tuple[bytes, str]]:
    return [(image.data, image.media_type) for image in answer.images]


def step(session: str, episode: str, index: int) -> pb.StepRequest:
    return pb.StepRequest(session_id=session, episode_id=episode, step_index=index, action=pb.Action(text="go"),
                          request_id=rid())  # fmt: skip


def test_images_round_trip_over_unary_batch_and_stream(stub: pb_grpc.EnvServiceStub) -> None:
    assert "images" in stub.GetServerInfo(pb.GetServerInfoRequest()).capabilities
    a, b, c = (open_session(stub, images=2) for _ in range(3))
    reset = stub.Reset(pb.ResetRequest(session_id=a, seed=5, request_id=rid()))
    assert reset.observation == "t=0 <image> <image>" and pairs(reset) == expected(5, 0, 2)
    out = stub.Step(step(a, reset.episode_id, 0))
    assert out.observation.count("<image>") == 2 and pairs(out) == expected(5, 1, 2)

    batched = stub.BatchReset(pb.BatchResetRequest(items=[pb.ResetRequest(session_id=b, seed=6, request_id=rid())]))
    first = batched.items[0]
    assert first.status.code == 0 and pairs(first) == expected(6, 0, 2)
    request = pb.BatchStepRequest(items=[step(b, first.episode_id, 0)])
    request.resets.add(session_id=c, seed=7, request_id=rid())
    mixed = stub.BatchStep(request)
    assert pairs(mixed.items[0]) == expected(6, 1, 2) and pairs(mixed.resets[0]) == expected(7, 0, 2)

    def requests() -> Iterator[pb.StreamRequest]:
        yield pb.StreamRequest(tag=1, reset=pb.ResetRequest(session_id=a, seed=8, request_id=rid()))

    (streamed,) = list(stub.Stream(requests(), timeout=10))
    assert pairs(streamed.reset) == expected(8, 0, 2)
    (stepped,) = list(stub.Stream(iter([pb.StreamRequest(tag=2, step=step(a, streamed.reset.episode_id, 0))])))
    assert pairs(stepped.step) == expected(8, 1, 2)


@pytest.mark.parametrize("transport", ["unary", "batch", "stream"])
async def test_the_client_fills_images_and_text_envs_are_unchanged(running: RunningServer, transport: str) -> None:
    async with EnvPool([running.address], transport=transport) as pool:
        pictures, lake = await pool.open("pictures", {"max_steps": 2}), await pool.open("frozenlake")
        first = await pictures.reset(seed=3)
        assert first.images == (ObservationImage(*expected(3, 0)[0]),) and first.observation == "t=0 <image>"
        out = await pictures.step("go")
        assert out.images == (ObservationImage(*expected(3, 1)[0]),)
        text = await lake.reset(seed=3)
        assert text.images == () and "<image>" not in text.observation
        assert (await lake.step("<answer>Left</answer>")).images == ()


@pytest.mark.parametrize("broken", BROKEN[1:])
def test_an_observation_breaking_a_rule_is_never_sent(stub: pb_grpc.EnvServiceStub, broken: str) -> None:
    words = {"too-many": "at most 8 per observation", "markers": "one marker per image", "media-type": "image/gif",
             "magic": "magic bytes", "too-big": "2 MiB", "not-bytes": "not bytes",
             "not-an-observation": "str or Observation"}[broken]  # fmt: skip
    session = open_session(stub, broken=broken, broken_at=-1)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Reset(pb.ResetRequest(session_id=session, seed=1, request_id=rid()))
    assert refused.value.code() == grpc.StatusCode.INTERNAL and words in refused.value.details()
    session = open_session(stub, broken=broken, broken_at=1)
    episode = stub.Reset(pb.ResetRequest(session_id=session, seed=1, request_id=rid())).episode_id
    stub.Step(step(session, episode, 0))
    (item,) = stub.BatchStep(pb.BatchStepRequest(items=[step(session, episode, 1)])).items
    assert item.status.code == grpc.StatusCode.INTERNAL.value[0] and words in item.status.message
    assert "breaks an image rule" in item.status.message or broken == "not-an-observation"
    assert not item.images and not item.observation
    with pytest.raises(grpc.RpcError) as after:  # the episode was aborted
        stub.Step(step(session, episode, 1))
    assert after.value.code() == grpc.StatusCode.FAILED_PRECONDITION


class DropsImages(EnvService):
    """Sends the text of image observations without their images (the markers stay): a protocol bug."""

    def _step_item(self, req: pb.StepRequest) -> pb.StepResult:
        result = pb.StepResult()
        result.CopyFrom(super()._step_item(req))
        del result.images[:]
        return result


async def test_the_client_refuses_markers_without_images() -> None:
    server = start_misbehaving(DropsImages, env_ids=("pictures",))
    try:
        async with EnvPool([server.address], transport="unary") as pool:
            session = await pool.open("pictures")
            assert len((await session.reset(seed=1)).images) == 1
            with pytest.raises(ProtocolViolation, match="1 <image> markers but the answer carries 0 images"):
                await session.step("go")
    finally:
        server.stop()


def test_conformance_passes_with_an_image_env() -> None:
    servers = [start_server(env_ids=("pictures",), max_sessions=20, session_ttl_s=2) for _ in range(2)]
    try:
        conforms(servers[0].address, "pictures", config={"images": 3}, second=servers[1].address, garbage="",
                 passed=["images"])  # fmt: skip
    finally:
        for server in servers:
            server.stop()


def test_conformance_fails_a_server_whose_images_differ_per_session() -> None:
    """The images rule catches images that are not a function of the seed (a random nonce in the data)."""
    lines: list[str] = []
    server = start_server(env_ids=("pictures",))
    try:
        support.image_envs.NONCE[0] = True
        results = run_conformance(server.address, "pictures", only=["images"], report=lines.append)
        assert results["images"].failed and "different images" in results["images"].detail, lines
    finally:
        support.image_envs.NONCE[0] = False
        server.stop()


async def test_replay_caches_hold_only_the_latest_answers_over_thousands_of_image_episodes() -> None:
    sessions_n, episodes_each = 8, 300  # 2,400 episodes of 3 steps, one image per observation
    server = start_server(env_ids=("pictures",))
    try:
        async with EnvPool([server.address], transport="batch") as pool:
            sessions = [await pool.open("pictures") for _ in range(sessions_n)]

            async def play(session: Any, base: int) -> None:
                for episode in range(episodes_each):
                    await session.reset(seed=base + episode)
                    while not (await session.step("go")).done:
                        pass

            await asyncio.gather(*(play(s, 10_000 * i) for i, s in enumerate(sessions)))
            table = server.server.table
            held = list(table._sessions.values())
            assert len(held) == sessions_n
            for session in held:  # one Reset and one Step answer per session, those of the latest episode
                reset, last = session.last_reset.result, session.last_step.result
                assert reset.episode_id == last.episode_id == session.episode_id and session.last_step.step_index == 2
                assert len(reset.images) == len(last.images) == 1
            assert len(table._created) <= 4 * table.max_sessions
    finally:
        server.stop()
