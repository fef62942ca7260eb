"""What an env server refuses before a handler runs: the size rule, the bearer-token check, undecodable messages.

The order matters for memory. gRPC reads a unary request's whole body before it calls the handler (and
decodes it there), so a check inside the handler comes too late to save anything. Instead:

1. `receive_limit` sets ``grpc.max_receive_message_length``: the transport stops reading a message once its
   length prefix is over the limit and answers RESOURCE_EXHAUSTED; the handler never sees it.
2. `TokenInterceptor` runs on the call's headers alone. A refused call gets a streaming handler that aborts
   with UNAUTHENTICATED without ever asking for the request, so its body is never buffered or decoded.
3. `DecodeGuard` turns bytes that are not a valid message into INVALID_ARGUMENT (grpc's default is UNKNOWN and a
   logged traceback; on the `Stream` RPC, a call left open forever). A unary Step whose encoded size is
   already over `max_action_bytes` plus room for its other fields is refused before it is decoded.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from roll_lightning.protocol.v1 import env_pb2 as pb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
# The largest request a client is expected to send is a BatchStep of `EnvPool`'s default max_batch (256) items,
# each with an action of max_action_bytes. Besides the action an item carries ids and a step index (about 160
# bytes measured with uuid-sized ids); ITEM_FIELDS_BYTES leaves room for reset options too.
BATCH_ITEMS = 256
ITEM_FIELDS_BYTES = 1024
HEADROOM_BYTES = 1024 * 1024  # CreateSession configs and DescribeEnv requests, whatever the action size


def receive_limit(max_action_bytes: int) -> int:
    """The receive-size limit for a server accepting actions of up to ``max_action_bytes``:
    ``256 * (max_action_bytes + 1 KiB) + 1 MiB`` (17.25 MiB for the default 64 KiB actions)."""
    return BATCH_ITEMS * (max_action_bytes + ITEM_FIELDS_BYTES) + HEADROOM_BYTES


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (None when it can): gRPC metadata values are printable ASCII, and a
    blank token would mean "no authentication" by accident."""
    if not token.strip():
        return "is empty (whitespace only)"
    if not all(33 <= ord(ch) <= 126 for ch in token):
        return "must be printable ASCII without spaces"
    return None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on EnvService calls (health and reflection stay open, for load
    balancers and grpcurl). Decided from the headers alone, before any of the request body is read."""

    def __init__(self, token: str) -> None:
        problem = token_problem(token)
        if problem:
            raise ValueError(f"token {problem}")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        if not details.method.startswith(f"/{SERVICE_NAME}/"):
            return await continuation(details)
        given = dict(details.invocation_metadata or ()).get("authorization", "")
        given = given.encode() if isinstance(given, str) else given
        if hmac.compare_digest(given, self._expected):
            return await continuation(details)
        reason = "wrong bearer token" if given else "no bearer token ('authorization: Bearer <token>' metadata)"
        return _refusal(grpc.StatusCode.UNAUTHENTICATED, f"{details.method}: {reason}")


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler that ends the call with ``code`` and never reads the request.

    Streaming on purpose, whatever the method's real shape: gRPC reads a unary request in full before calling
    its handler, but hands a streaming one an iterator that reads nothing until asked. The wire format is the
    same, so a unary client just sees the status."""

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class _Malformed:
    """Stands in for a request whose bytes are not a valid message, so the call can be refused cleanly."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        self.message, self.code = message, code


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Undecodable requests get INVALID_ARGUMENT, on unary calls and on the `Stream` RPC (which it then closes, after
    answering what came before); an oversized unary Step is refused without being decoded."""

    def __init__(self, max_action_bytes: int) -> None:
        self._max_step_bytes = max_action_bytes + ITEM_FIELDS_BYTES

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(f"/{SERVICE_NAME}/"):
            return handler
        name = details.method.rsplit("/", 1)[-1]
        if handler.stream_stream is not None:
            return self._guard_stream(handler, f"{name}Request")
        if handler.unary_unary is not None:
            return self._guard_unary(handler, name)
        return handler  # EnvService has no other shapes

    def _safe_decode(self, decode: Callable[[bytes], Any], type_name: str, size_limit: int | None) -> Any:
        def safe_decode(data: bytes) -> Any:
            if size_limit is not None and len(data) > size_limit:
                return _Malformed(
                    f"{type_name} is {len(data)} bytes, over this server's max_action_bytes "
                    f"({size_limit - ITEM_FIELDS_BYTES}) plus {ITEM_FIELDS_BYTES} for the other fields; not decoded"
                )
            try:
                return decode(data)
            except DecodeError as exc:
                return _Malformed(f"request is not a valid {type_name} message: {exc}")

        return safe_decode

    def _guard_unary(self, handler: grpc.RpcMethodHandler, name: str) -> grpc.RpcMethodHandler:
        behaviour = handler.unary_unary
        size_limit = self._max_step_bytes if name == "Step" else None

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                await context.abort(request.code, request.message)
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=self._safe_decode(handler.request_deserializer, f"{name}Request", size_limit),
            response_serializer=handler.response_serializer,
        )

    def _guard_stream(self, handler: grpc.RpcMethodHandler, type_name: str) -> grpc.RpcMethodHandler:
        behaviour = handler.stream_stream

        async def guarded(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            bad: list[_Malformed] = []

            async def until_malformed() -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, _Malformed):
                        bad.append(request)
                        return  # the handler sees the end of its input and answers what it already has
                    yield request

            async for response in behaviour(until_malformed(), context):
                yield response
            if bad:
                await context.abort(bad[0].code, bad[0].message)

        return grpc.stream_stream_rpc_method_handler(
            guarded,
            request_deserializer=self._safe_decode(handler.request_deserializer, type_name, None),
            response_serializer=handler.response_serializer,
        )


__all__ = ["DecodeGuard", "TokenInterceptor", "receive_limit", "token_problem"]
