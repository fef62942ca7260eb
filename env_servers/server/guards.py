"""What an env server refuses before a handler runs: oversized, unauthenticated and undecodable requests.

gRPC reads a unary request's whole body before calling its handler, so these checks live in the transport
options and interceptors instead (docs/security.md has the guarantees).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from roll_lightning.protocol.v1 import env_pb2 as pb

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
# The largest expected request: a BatchStep of `EnvPool`'s default 256 items at max_action_bytes each. An item's
# other fields take ~160 bytes with uuid ids; ITEM_FIELDS_BYTES leaves room for reset options too.
BATCH_ITEMS = 256
ITEM_FIELDS_BYTES = 1024
HEADROOM_BYTES = 1024 * 1024  # configs, whatever the action size


def receive_limit(max_action_bytes: int) -> int:
    """The receive-size limit: 17.25 MiB for the default 64 KiB actions."""
    return BATCH_ITEMS * (max_action_bytes + ITEM_FIELDS_BYTES) + HEADROOM_BYTES


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (gRPC metadata is printable ASCII; blank means none), or None."""
    if not token.strip():
        return "is empty (whitespace only)"
    if not all(33 <= ord(ch) <= 126 for ch in token):
        return "must be printable ASCII without spaces"
    return None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Requires ``authorization: Bearer <token>`` on EnvService calls, judged from the headers alone."""

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

    Streaming whatever the method's shape: a streaming handler's request iterator reads nothing until asked,
    and the wire format is the same, so a unary client just sees the status."""

    async def refuse(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class _Malformed:
    """Stands in for an undecodable request, so the call can be refused cleanly."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT) -> None:
        self.message, self.code = message, code


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Undecodable requests get INVALID_ARGUMENT (grpc's default: UNKNOWN, or a `Stream` left open); an oversized
    unary Step is refused undecoded."""

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
        return handler

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
                        return  # answer what came before
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
