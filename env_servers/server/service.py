"""The EnvService gRPC handlers (grpc.aio) over a `SessionTable`.

Env code runs off the event loop (a batch where `BatchPlacement` says), so a slow env cannot stall health
checks or other sessions. A batch item whose deadline has passed is answered DEADLINE_EXCEEDED without
touching the env, so a retry runs it exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from env_servers.server.placement import BatchPlacement
from env_servers.server.sessions import ProtocolError, SessionTable
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

PROTOCOL_VERSION = "v1"
IMPLEMENTATION = "env_servers-python/0.1.0"
CAPABILITIES = (
    "batch",
    "batch-mixed",
    "stream",
    "images",
    "tools",  # a text env answers calls as bad calls
    "fork",  # for envs with EnvSpec.forkable
)
T = TypeVar("T")
STREAM_BACKLOG = 1024
"""Requests one Stream may have read whose answers are not yet sent: a client that stops reading its answers stops
being read (else its answers pile up here: 50,000 unread FrozenLake steps grew a server by 75 MB)."""


class EnvService(pb_grpc.EnvServiceServicer):
    def __init__(self, table: SessionTable, *, max_action_bytes: int, workers: int) -> None:
        self.table = table
        self.max_action_bytes = max_action_bytes
        self.draining = False
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="env")
        self.placement = BatchPlacement()
        self.stream_backlog_limit = STREAM_BACKLOG  # per stream
        self.stream_backlog = 0  # over all streams: requests read, answers not yet sent

    async def _call(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the pool and turn a ProtocolError into the RPC's status."""
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before the call started")
        try:
            # shielded: if the client gives up, the work still finishes and is replayable by request_id.
            return await asyncio.shield(asyncio.get_running_loop().run_in_executor(self.pool, fn))
        except ProtocolError as err:
            await context.abort(err.code, err.message)
        raise AssertionError("unreachable")

    def _reset_item(self, req: pb.ResetRequest) -> pb.ResetResult:
        return self.table.run(req.session_id, lambda s: s.reset(req, draining=self.draining))

    def _step_item(self, req: pb.StepRequest) -> pb.StepResult:
        return self.table.run(req.session_id, lambda s: s.step(req, self.max_action_bytes))

    def _batch(self, items: Any, run: Callable[[Any], Any], failed: Callable[..., Any], deadline: float | None):
        results = []
        for req in items:
            if deadline is not None and time.monotonic() >= deadline:
                err = ProtocolError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline expired before this item ran")
                results.append(failed(status=err.status(), session_id=req.session_id))
                continue
            try:
                results.append(run(req))
            except ProtocolError as err:
                results.append(failed(status=err.status(), session_id=req.session_id))
        return results

    @staticmethod
    def _deadline(context: grpc.aio.ServicerContext) -> float | None:
        remaining = context.time_remaining()
        return None if remaining is None else time.monotonic() + remaining

    async def GetServerInfo(self, request: pb.GetServerInfoRequest, context: Any) -> pb.ServerInfo:
        return pb.ServerInfo(
            protocol_version=PROTOCOL_VERSION,
            server_id=self.table.server_id,
            env_ids=self.table.env_ids,
            max_sessions=self.table.max_sessions,
            active_sessions=len(self.table),
            draining=self.draining,
            max_action_bytes=self.max_action_bytes,
            session_ttl_s=self.table.session_ttl_s,
            implementation=IMPLEMENTATION,
            capabilities=list(CAPABILITIES),
        )

    async def DescribeEnv(self, request: pb.DescribeEnvRequest, context: Any) -> pb.EnvSpec:
        return await self._call(context, lambda: self.table.describe(request.env_id, request.config))

    async def CreateSession(self, request: pb.CreateSessionRequest, context: Any) -> pb.CreateSessionResponse:
        return await self._call(context, lambda: self.table.create(request, draining=self.draining))

    async def ForkSession(self, request: pb.ForkSessionRequest, context: Any) -> pb.ForkSessionResponse:
        return await self._call(context, lambda: self.table.fork(request, draining=self.draining))

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:
        return pb.CloseSessionResponse(existed=await self._call(context, lambda: self.table.close(request.session_id)))

    async def Reset(self, request: pb.ResetRequest, context: Any) -> pb.ResetResult:
        return await self._call(context, lambda: self._reset_item(request))

    async def Step(self, request: pb.StepRequest, context: Any) -> pb.StepResult:
        return await self._call(context, lambda: self._step_item(request))

    async def BatchReset(self, request: pb.BatchResetRequest, context: Any) -> pb.BatchResetResponse:
        (items,) = await self._run_batch({"reset": request.items}, context)
        return pb.BatchResetResponse(items=items)

    async def BatchStep(self, request: pb.BatchStepRequest, context: Any) -> pb.BatchStepResponse:
        # `resets` ride along ("batch-mixed"): one RPC a turn instead of two.
        if not request.resets:
            (items,) = await self._run_batch({"step": request.items}, context)
            return pb.BatchStepResponse(items=items)
        items, resets = await self._run_batch({"step": request.items, "reset": request.resets}, context)
        return pb.BatchStepResponse(items=items, resets=resets)

    async def _run_batch(self, parts: dict[str, Any], context: Any) -> list[list[Any]]:
        """Run a batch's parts (kind -> items) where `BatchPlacement` says, recording their cost."""
        deadline = self._deadline(context)

        def run() -> list[list[Any]]:
            out = []
            for kind, items in parts.items():
                run_item, failed = (
                    (self._step_item, pb.StepResult) if kind == "step" else (self._reset_item, pb.ResetResult)
                )
                start = time.perf_counter()
                out.append(self._batch(items, run_item, failed, deadline))
                if items:
                    self.placement.record(kind, (time.perf_counter() - start) / len(items))
            return out

        sizes = {kind: len(items) for kind, items in parts.items()}
        where = self.placement.choose(sizes, waits_on_io=self._waits_on_io(parts), draining=self.draining)
        if where == "inline":
            return run()
        if where == "pool":
            return await self._call(context, run)
        return await self._run_spread(parts, deadline)

    def _waits_on_io(self, parts: dict[str, Any]) -> bool:
        """Whether any item's env declares ``waits_on_io`` (then spread, however cheap in CPU)."""
        for items in parts.values():
            for item in items:
                session = self.table.find(item.session_id)
                if session is not None and getattr(session.env, "waits_on_io", False):
                    return True
        return False

    async def _run_spread(self, parts: dict[str, Any], deadline: float | None) -> list[list[Any]]:
        """Run the items over many pool threads at once, so slow items' latencies overlap."""
        loop = asyncio.get_running_loop()
        workers = max(1, self.pool._max_workers)
        out = []
        for kind, items in parts.items():
            run_item, failed = (
                (self._step_item, pb.StepResult) if kind == "step" else (self._reset_item, pb.ResetResult)
            )
            chunks = [list(items[i::workers]) for i in range(min(workers, len(items)))]
            start = time.perf_counter()
            jobs = [loop.run_in_executor(self.pool, self._batch, chunk, run_item, failed, deadline) for chunk in chunks]
            answered = await asyncio.shield(asyncio.gather(*jobs))
            # chunk i holds items i, i+W, ...: restore request order
            results: list[Any] = [None] * len(items)
            for i, chunk_results in enumerate(answered):
                results[i :: len(chunks)] = chunk_results
            out.append(results)
            if items:
                self.placement.record(kind, (time.perf_counter() - start) * len(chunks) / len(items))
        return out

    async def Stream(
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: Any
    ) -> AsyncIterator[pb.StreamResponse]:
        # Requests arriving while earlier ones run are answered together in one pool job; up to `workers` jobs
        # run at once, so one slow env does not hold up the stream's other sessions. At most
        # `stream_backlog_limit` requests are read ahead of the answers sent (one answer per request).
        loop = asyncio.get_running_loop()
        out: asyncio.Queue[pb.StreamResponse | None] = asyncio.Queue()
        waiting: list[pb.StreamRequest] = []
        arrived = asyncio.Event()
        jobs = asyncio.Semaphore(self.pool._max_workers)
        room = asyncio.Semaphore(self.stream_backlog_limit)
        held = 0  # this stream's share of `stream_backlog`
        running: set[asyncio.Task[None]] = set()

        def answer(req: pb.StreamRequest) -> pb.StreamResponse:
            kind = req.WhichOneof("request")
            if kind == "reset":
                result = self._batch([req.reset], self._reset_item, pb.ResetResult, None)[0]
                return pb.StreamResponse(tag=req.tag, reset=result)
            if kind == "step":
                result = self._batch([req.step], self._step_item, pb.StepResult, None)[0]
                return pb.StreamResponse(tag=req.tag, step=result)
            status = pb.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="request: set reset or step")
            return pb.StreamResponse(tag=req.tag, step=pb.StepResult(status=status))

        async def run(batch: list[pb.StreamRequest]) -> None:
            try:
                for response in await loop.run_in_executor(self.pool, lambda: [answer(r) for r in batch]):
                    out.put_nowait(response)
            finally:
                jobs.release()

        async def read() -> None:
            nonlocal held
            requests = aiter(request_iterator)
            try:
                while True:
                    await room.acquire()  # room for the answer first: an unread client is not read either
                    try:
                        req = await anext(requests)
                    except StopAsyncIteration:
                        return
                    held += 1
                    self.stream_backlog += 1
                    waiting.append(req)
                    arrived.set()
            finally:  # however reading ends, wake the dispatcher to finish
                arrived.set()

        async def dispatch(reader: asyncio.Task[None]) -> None:
            while True:
                await arrived.wait()
                arrived.clear()
                if not waiting and reader.done():
                    break
                if waiting:
                    await jobs.acquire()
                    await asyncio.sleep(0)  # let requests already on the wire join this job
                    batch = waiting[:]
                    waiting.clear()
                    task = asyncio.create_task(run(batch))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    if reader.done():
                        arrived.set()
            if running:
                await asyncio.gather(*list(running), return_exceptions=True)
            out.put_nowait(None)

        reader = asyncio.create_task(read())
        dispatcher = asyncio.create_task(dispatch(reader))
        try:
            while (item := await out.get()) is not None:
                yield item
                held -= 1
                self.stream_backlog -= 1
                room.release()
        finally:
            reader.cancel()
            dispatcher.cancel()
            self.stream_backlog -= held
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            raise reader.exception()  # end the call with its status


__all__ = ["EnvService", "PROTOCOL_VERSION"]
