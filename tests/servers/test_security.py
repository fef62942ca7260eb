"""Servers on other hosts: bearer token and TLS, through the real client; what is refused before a handler runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
import trustme
from support.servers import start_server

from env_servers.server.guards import receive_limit
from roll_lightning.env_client import EnvPool, EpisodeFailed, NoEndpointAvailable
from roll_lightning.env_client.client import EnvClient
from roll_lightning.env_client.errors import EndpointRefused, EndpointTlsMismatch
from roll_lightning.protocol.v1 import env_pb2 as pb

SERVICE = "/roll_lightning.env.v1.EnvService"


def raw_unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable:
    """A call that sends the given bytes as they are: garbage and oversized bodies included."""
    return channel.unary_unary(f"{SERVICE}/{method}", request_serializer=lambda b: b, response_deserializer=lambda b: b)


def code_and_details(call: grpc.UnaryUnaryMultiCallable, body: bytes, **kwargs: object) -> tuple[grpc.StatusCode, str]:
    try:
        call(body, **kwargs)
    except grpc.RpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def test_token_is_required_for_env_calls_but_not_health():
    running = start_server(token="s3cret")
    try:
        stranger = EnvClient(running.address)
        assert await stranger.health() == 1, "health stays open for load balancers"
        with pytest.raises(EpisodeFailed) as info:
            await stranger.server_info()
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED
        await stranger.close()
        async with EnvPool([running.address], token="s3cret") as pool:
            session = await pool.open("frozenlake")
            assert (await session.reset(seed=3)).observation
            assert (await session.step("<answer>Up</answer>")).action_valid
    finally:
        running.stop()


@pytest.mark.parametrize("token", ["wrong", None], ids=["wrong-token", "no-token"])
async def test_a_pool_without_the_right_token_is_told_so_at_start_naming_the_endpoint(token: str | None):
    """Before: health answers SERVING without a token, GetServerInfo fails, and `start` waited out its whole
    start_timeout_s, then said "no env endpoint is reachable". Now the first refusal ends `start`."""
    running = start_server(token="s3cret")
    try:
        pool = EnvPool([running.address], token=token, start_timeout_s=30.0)
        with pytest.raises(EndpointRefused) as info:
            await pool.start()
        assert isinstance(info.value, NoEndpointAvailable), "callers that catch NoEndpointAvailable still do"
        assert info.value.code == grpc.StatusCode.UNAUTHENTICATED and info.value.endpoint == running.address
        assert running.address in str(info.value) and "bearer token is missing or wrong" in str(info.value)
        assert not pool._tasks, "nothing of the failed pool keeps running"
    finally:
        running.stop()


def test_a_token_grpc_cannot_send_is_refused_by_the_client():
    with pytest.raises(ValueError, match="printable ASCII"):
        EnvClient("127.0.0.1:1", token="s3cret\n")
    with pytest.raises(ValueError, match="printable ASCII"):
        EnvClient("127.0.0.1:1", token="   ")


def test_an_unauthenticated_request_is_refused_without_reading_its_body():
    """The token is checked on the headers: a body the server would not even read (over its receive limit) gets
    UNAUTHENTICATED, not RESOURCE_EXHAUSTED, and garbage gets UNAUTHENTICATED, not a decode error."""
    running = start_server(token="s3cret", max_message_bytes=64 * 1024)
    try:
        with grpc.insecure_channel(running.address, options=[("grpc.max_send_message_length", 1 << 24)]) as channel:
            for method in ("Step", "BatchStep", "CreateSession", "Stream"):
                code, details = code_and_details(raw_unary(channel, method), b"\xff" * 200_000)
                assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
                assert "no bearer token" in details
            code, _ = code_and_details(raw_unary(channel, "Step"), b"x", metadata=(("authorization", "Bearer no"),))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            with_token = (("authorization", "Bearer s3cret"),)
            code, details = code_and_details(raw_unary(channel, "Step"), b"\xff" * 200_000, metadata=with_token)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, "with the token, the size limit applies"
    finally:
        running.stop()


def test_the_receive_limit_follows_max_action_bytes_and_admits_a_full_batch():
    limit = receive_limit(1000)
    assert limit == 256 * (1000 + 1024) + 1024 * 1024
    running = start_server(max_action_bytes=1000)
    try:
        options = [("grpc.max_send_message_length", 1 << 24), ("grpc.max_receive_message_length", 1 << 24)]
        with grpc.insecure_channel(running.address, options=options) as channel:
            full = pb.BatchStepRequest(
                items=[
                    pb.StepRequest(
                        session_id=f"s-{i:032x}",
                        episode_id=f"ep-{i:032x}",
                        step_index=i,
                        action=pb.Action(text="x" * 1000),
                        request_id=f"{i:064x}",
                    )
                    for i in range(256)
                ]
            )
            answer = pb.BatchStepResponse.FromString(raw_unary(channel, "BatchStep")(full.SerializeToString()))
            assert len(answer.items) == 256, "a BatchStep of 256 max-size actions is read and answered"
            code, details = code_and_details(raw_unary(channel, "BatchStep"), b"\xff" * (limit + 1))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details, details
            step = pb.StepRequest(session_id="s", action=pb.Action(text="x" * 5000)).SerializeToString()
            code, details = code_and_details(raw_unary(channel, "Step"), step)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "not decoded" in details, details
    finally:
        running.stop()


@pytest.mark.timeout(120)  # a hang guard: before the fix this call never ended
def test_garbage_on_stream_ends_the_call_with_invalid_argument_after_answering_what_came_before():
    running = start_server()
    release = threading.Event()
    try:
        with grpc.insecure_channel(running.address) as channel:
            session = pb.CreateSessionResponse.FromString(
                raw_unary(channel, "CreateSession")(
                    pb.CreateSessionRequest(env_id="frozenlake", request_id="r").SerializeToString()
                )
            ).session_id
            reset = pb.StreamRequest(tag=7, reset=pb.ResetRequest(session_id=session, seed=1, request_id="r"))

            def requests() -> Iterator[bytes]:
                yield reset.SerializeToString()
                yield b"\xff\xff\xff"
                release.wait()  # the client keeps its side open: the server must end the call itself

            stream = channel.stream_stream(
                f"{SERVICE}/Stream", request_serializer=lambda b: b, response_deserializer=pb.StreamResponse.FromString
            )
            call = stream(requests())
            answers = []
            with pytest.raises(grpc.RpcError) as info:
                for answer in call:
                    answers.append(answer)
            assert [(a.tag, a.reset.status.code) for a in answers] == [(7, 0)], "the valid request was answered"
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid StreamRequest" in info.value.details()
    finally:
        release.set()
        running.stop()


async def test_tls_with_a_private_ca():
    ca = trustme.CA()
    cert = ca.issue_cert("env-host.test")
    running = start_server(
        tls_cert=cert.cert_chain_pems[0].bytes() + b"".join(p.bytes() for p in cert.cert_chain_pems[1:]),
        tls_key=cert.private_key_pem.bytes(),
        token="t",
    )
    try:
        async with EnvPool(
            [running.address], tls_root_cert=ca.cert_pem.bytes(), tls_server_name="env-host.test", token="t"
        ) as pool:
            session = await pool.open("sokoban")
            assert "P" in (await session.reset(seed=1)).observation
        plain = EnvClient(running.address)  # a plaintext client cannot talk to a TLS server
        with pytest.raises(EpisodeFailed):
            await plain.health(timeout=1.0)
        await plain.close()
        other_ca = trustme.CA()
        wrong = EnvClient(running.address, tls_root_cert=other_ca.cert_pem.bytes(), tls_server_name="env-host.test")
        with pytest.raises(EpisodeFailed):
            await wrong.health(timeout=1.0)
        await wrong.close()
    finally:
        running.stop()


async def test_a_tls_mismatch_is_named_at_start_both_ways() -> None:
    """A plaintext pool against a TLS server, and a TLS pool against a plaintext one: `start` says which at the
    first connection (a start timeout of two minutes would otherwise end in "not reachable")."""
    ca = trustme.CA()
    cert = ca.issue_cert("env-host.test")
    secure = start_server(
        tls_cert=cert.cert_chain_pems[0].bytes() + b"".join(p.bytes() for p in cert.cert_chain_pems[1:]),
        tls_key=cert.private_key_pem.bytes(),
    )
    plain = start_server()
    try:
        with pytest.raises(EndpointTlsMismatch, match="speaks TLS, and this client connects in plaintext: set "
                           "data.envs.tls_root_cert"):  # fmt: skip
            async with EnvPool([secure.address], start_timeout_s=120):
                pass
        with pytest.raises(EndpointTlsMismatch, match="does not speak TLS"):
            async with EnvPool(
                [plain.address], start_timeout_s=120, tls_root_cert=ca.cert_pem.bytes(), tls_server_name="env-host.test"
            ):
                pass
        async with EnvPool(
            [secure.address], tls_root_cert=ca.cert_pem.bytes(), tls_server_name="env-host.test"
        ) as pool:  # and a matching pair still starts
            assert pool.healthy_endpoints() == [secure.address]
    finally:
        secure.stop()
        plain.stop()


def test_refused_large_requests_do_not_grow_the_server() -> None:
    """16 concurrent 15 MB requests without the token: refused from their headers, and the transport buffers no
    megabytes of their bodies first (HTTP/2 bandwidth-delay probing off: with it the server grew 6-29 MB)."""
    import psutil

    from roll_lightning.env_client.local import launch_local_server

    server = launch_local_server(["frozenlake"], extra_args=["--token", "s3cret", "--max-message-bytes", str(2**26)])
    try:
        process = psutil.Process(server.process.pid)
        before = process.memory_info().rss
        body, codes = b"\xff" * (15 * 2**20), []

        def send() -> None:
            with grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", 2**26)]) as channel:
                codes.append(code_and_details(raw_unary(channel, "Step"), body, timeout=60)[0])

        senders = [threading.Thread(target=send) for _ in range(16)]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
        grown = (process.memory_info().rss - before) / 2**20
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 16
        assert grown < 5, f"the server grew {grown:.1f} MB"
    finally:
        server.stop()
