"""`EnvClient`: one env server endpoint, over grpc.aio, with a deadline on every call.

Calls with a request_id are retried on UNAVAILABLE until the deadline with the same id, so the server replays
rather than repeats them; others fail at once. Failures surface as `EpisodeFailed`, never as a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from roll_lightning.env_client.errors import RETRIED_CODES, EpisodeFailed
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
_CONNECTION_SETTLE_S = 0.2  # how long a stream that ended INTERNAL waits to see whether its connection went too
T = TypeVar("T")


class EnvClient:
    """A connection to one env server (``host:port``)."""

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_root_cert: bytes | None = None,
        tls_server_name: str | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,  # answers may carry images: 8 x 2 MiB per observation
    ) -> None:
        if token and not all(33 <= ord(ch) <= 126 for ch in token):  # gRPC would fail every call, obscurely
            raise ValueError("token: a bearer token is printable ASCII without spaces or line breaks")
        self.address = address
        self.retried_calls = 0  # env/retried_calls_total
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.enable_retries", 0),  # retries are ours: only idempotent calls, only until the deadline
        ]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_root_cert is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
            self.channel = grpc.aio.secure_channel(address, creds, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self._stream: _StreamMux | None = None

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        await self.channel.close()

    # -- plumbing ------------------------------------------------------------------------------------

    def _failed(self, err: grpc.aio.AioRpcError, session_id: str = "") -> EpisodeFailed:
        return EpisodeFailed(err.code(), err.details() or "", endpoint=self.address, session_id=session_id)

    async def _retrying(self, attempt: Callable[[float], Awaitable[T]], timeout: float, session_id: str = "") -> T:
        deadline = time.monotonic() + timeout
        backoff = 0.05
        first = True
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EpisodeFailed(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"no answer within {timeout:.1f}s",
                    endpoint=self.address,
                    session_id=session_id,
                )
            try:
                return await attempt(remaining)
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRIED_CODES or (err.details() or "").startswith("draining"):
                    raise self._failed(err, session_id) from err  # a draining server will not take it later
                if first:  # calls that needed a retry, not tries
                    self.retried_calls, first = self.retried_calls + 1, False
                await asyncio.sleep(min(backoff * (0.5 + random.random()), max(0.0, deadline - time.monotonic())))
                backoff = min(backoff * 2, 1.0)

    async def _once(self, method: Any, request: Any, timeout: float, session_id: str = "") -> Any:
        try:
            return await method(request, timeout=timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as err:
            raise self._failed(err, session_id) from err

    # -- calls ---------------------------------------------------------------------------------------

    async def health(self, timeout: float = 2.0) -> int:
        reply = await self._once(self.health_stub.Check, health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout)
        return reply.status

    async def server_info(self, timeout: float = 5.0) -> pb.ServerInfo:
        return await self._once(self.stub.GetServerInfo, pb.GetServerInfoRequest(), timeout)

    async def describe(self, env_id: str, config: dict[str, Any] | None = None, timeout: float = 10.0) -> pb.EnvSpec:
        request = pb.DescribeEnvRequest(env_id=env_id)
        if config:
            request.config.update(config)
        return await self._once(self.stub.DescribeEnv, request, timeout)

    async def create_session(self, request: pb.CreateSessionRequest, timeout: float) -> pb.CreateSessionResponse:
        return await self._retrying(
            lambda t: self.stub.CreateSession(request, timeout=t, metadata=self.metadata), timeout
        )

    async def close_session(self, session_id: str, timeout: float = 5.0) -> bool:
        reply = await self._once(self.stub.CloseSession, pb.CloseSessionRequest(session_id=session_id), timeout)
        return reply.existed

    async def fork_session(self, request: pb.ForkSessionRequest, timeout: float) -> pb.ForkSessionResponse:
        """Copies of a session (retried safely: the server answers a retried ``request_id`` with the same copies)."""
        return await self._retrying(
            lambda t: self.stub.ForkSession(request, timeout=t, metadata=self.metadata), timeout, request.session_id
        )

    async def reset(self, request: pb.ResetRequest, timeout: float) -> pb.ResetResult:
        return await self._retrying(
            lambda t: self.stub.Reset(request, timeout=t, metadata=self.metadata), timeout, request.session_id
        )

    async def step(self, request: pb.StepRequest, timeout: float) -> pb.StepResult:
        return await self._retrying(
            lambda t: self.stub.Step(request, timeout=t, metadata=self.metadata), timeout, request.session_id
        )

    async def batch_reset(self, items: Sequence[pb.ResetRequest], timeout: float) -> list[pb.ResetResult]:
        request = pb.BatchResetRequest(items=items)
        reply = await self._retrying(
            lambda t: self.stub.BatchReset(request, timeout=t, metadata=self.metadata), timeout
        )
        return list(reply.items)

    async def batch_step(self, items: Sequence[pb.StepRequest], timeout: float) -> list[pb.StepResult]:
        request = pb.BatchStepRequest(items=items)
        reply = await self._retrying(lambda t: self.stub.BatchStep(request, timeout=t, metadata=self.metadata), timeout)
        return list(reply.items)

    async def batch_mixed(
        self, items: Sequence[pb.StepRequest | pb.ResetRequest], timeout: float
    ) -> list[pb.StepResult | pb.ResetResult]:
        """Steps and resets in one BatchStep call ("batch-mixed"), results in order; resets an older server
        ignored are sent again as a BatchReset."""
        resets = [r for r in items if type(r) is pb.ResetRequest]
        if not resets:
            return await self.batch_step(items, timeout)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout
        steps = [r for r in items if type(r) is pb.StepRequest]
        request = pb.BatchStepRequest(items=steps, resets=resets)
        reply = await self._retrying(lambda t: self.stub.BatchStep(request, timeout=t, metadata=self.metadata), timeout)
        reset_results: Sequence[pb.ResetResult] = reply.resets
        if len(reset_results) != len(resets):
            reset_results = await self.batch_reset(resets, max(0.001, deadline - time.monotonic()))
        step_iter, reset_iter = iter(reply.items), iter(reset_results)
        return [next(step_iter) if type(r) is pb.StepRequest else next(reset_iter) for r in items]

    async def stream_call(self, request: pb.ResetRequest | pb.StepRequest, timeout: float) -> Any:

        async def attempt(remaining: float) -> Any:
            if self._stream is None or self._stream.broken:
                self._stream = _StreamMux(self)
            return await self._stream.call(request, remaining)

        return await self._retrying(attempt, timeout, request.session_id)


class _StreamMux:
    """One long-lived Stream RPC shared by many episodes; answers are matched to callers by tag."""

    def __init__(self, client: EnvClient) -> None:
        self._outbox: asyncio.Queue[pb.StreamRequest | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tags = itertools.count(1)
        self.broken = False
        self._channel = client.channel
        self._call = client.stub.Stream(self._requests(), metadata=client.metadata)
        self._reader = asyncio.ensure_future(self._read())

    async def _requests(self) -> Any:
        while (item := await self._outbox.get()) is not None:
            yield item

    async def _read(self) -> None:
        try:
            async for response in self._call:
                fut = self._pending.pop(response.tag, None)
                if fut is None or fut.done():
                    continue
                kind = response.WhichOneof("result")
                if kind is None:  # fails its own call, not the stream
                    fut.set_exception(_rpc_error(grpc.StatusCode.INTERNAL, "a stream answer without a result"))
                else:
                    fut.set_result(getattr(response, kind))
            error: BaseException = _rpc_error(grpc.StatusCode.UNAVAILABLE, "stream ended")
        except grpc.aio.AioRpcError as err:
            error = err
        except asyncio.CancelledError:
            error = _rpc_error(grpc.StatusCode.CANCELLED, "stream closed")
        except Exception as err:  # later calls open a new stream
            error = _rpc_error(grpc.StatusCode.UNAVAILABLE, f"stream reader failed: {err!r}")
        self.broken = True
        if isinstance(error, grpc.aio.AioRpcError) and error.code() == grpc.StatusCode.INTERNAL:
            try:
                error = await self._outage_if_disconnected(error)
            except asyncio.CancelledError:
                error = _rpc_error(grpc.StatusCode.CANCELLED, "stream closed")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(error)
        self._pending.clear()

    async def _outage_if_disconnected(self, err: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
        """The stream's end as the server or the network ended it. When a request is being written as the call
        ends, grpc.aio gives the call its own status, INTERNAL "Internal error from Core", in place of the one the
        server sent (UNAVAILABLE from a server shutting down): a stream ending INTERNAL while its connection is
        gone (the channel no longer READY: a GOAWAY, a dropped connection) is an outage, retried as unary and
        batch calls are. An env that raised is an item's status, never the stream's."""
        ready = grpc.ChannelConnectivity.READY
        if self._channel.get_state() == ready:  # the connection's end may reach the channel a moment later
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._channel.wait_for_state_change(ready), _CONNECTION_SETTLE_S)
        if self._channel.get_state() == ready:
            return err  # the server itself ended the stream INTERNAL
        return _rpc_error(grpc.StatusCode.UNAVAILABLE, f"the stream's connection went away ({err.details()})")

    async def call(self, request: pb.ResetRequest | pb.StepRequest, timeout: float) -> Any:
        if self.broken:
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, "stream broken")
        tag = next(self._tags)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[tag] = fut
        kind = "reset" if isinstance(request, pb.ResetRequest) else "step"
        self._outbox.put_nowait(pb.StreamRequest(tag=tag, **{kind: request}))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._pending.pop(tag, None)
            raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer on the stream") from None

    def close(self) -> None:
        self._outbox.put_nowait(None)
        self._call.cancel()
        self._reader.cancel()


def _rpc_error(code: grpc.StatusCode, detail: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), detail)
