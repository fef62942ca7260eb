"""Real env servers with one deliberate protocol bug each, as a third-party author might write them.

Each is our server with one behaviour changed, served over real gRPC on 127.0.0.1: they are the subject of the
tests (does the suite catch the bug, does the client refuse to trust it), not stand-ins for a dependency.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from env_servers.server import EnvServer, RunningServer, ServerConfig
from env_servers.server.service import EnvService
from roll_lightning.protocol.v1 import env_pb2 as pb


class ServerWideReplay(EnvService):
    """Keys its replay cache by request_id alone, server-wide: a client that numbers ids per session ("1", "2",
    ...) gets the first session's answers in every other session."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answers: dict[tuple[str, str], Any] = {}

    def _reset_item(self, req: pb.ResetRequest) -> pb.ResetResult:
        key = ("reset", req.request_id)
        if key not in self.answers:
            self.answers[key] = super()._reset_item(req)
        return self.answers[key]

    def _step_item(self, req: pb.StepRequest) -> pb.StepResult:
        key = ("step", req.request_id)
        if key not in self.answers:
            self.answers[key] = super()._step_item(req)
        return self.answers[key]


class UnaryOnly(EnvService):
    """Advertises no optional capability and answers UNIMPLEMENTED for batches and streams (allowed by the spec)."""

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any) -> pb.ServerInfo:
        info = await super().GetServerInfo(request, context)
        del info.capabilities[:]
        return info

    async def BatchReset(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no batches here")

    async def BatchStep(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no batches here")

    async def Stream(self, request_iterator: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no stream here")


class FirstStreamAnswerEmpty(EnvService):
    """Answers the first request on each stream with its tag and no result at all; the rest normally."""

    async def Stream(self, request_iterator: AsyncIterator[pb.StreamRequest], context: Any) -> Any:
        first = True
        async for response in super().Stream(request_iterator, context):
            if first:
                first = False
                yield pb.StreamResponse(tag=response.tag)
            else:
                yield response


def start_misbehaving(service: type[EnvService], env_ids: tuple[str, ...] = ("frozenlake", "sokoban")) -> RunningServer:
    """Our server with ``service`` in place of `EnvService`, in a thread of the test process."""

    class Server(EnvServer):
        def __init__(self, config: ServerConfig) -> None:
            super().__init__(config)
            self.service = service(self.table, max_action_bytes=config.max_action_bytes, workers=config.workers)

    return Server.run_in_thread(ServerConfig(env_ids=env_ids, port=0))


class ForkRetryMakesMore(EnvService):
    """Forgets its forks: a retried ForkSession (same request_id) makes new copies instead of answering the same."""

    async def ForkSession(self, request: pb.ForkSessionRequest, context: Any) -> pb.ForkSessionResponse:
        session = self.table.find(request.session_id)
        if session is not None:
            session.last_fork = None
        return await super().ForkSession(request, context)
