"""Concurrent Reset/Step calls bound for one endpoint travel together in one BatchReset/BatchStep RPC.

Adaptive, no timer: with at most ``max_inflight`` batches out, what arrives meanwhile joins the next one, so 64
episodes cost one RPC per turn. Every caller gets an answer (never a hang); a call its caller gave up is not sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import grpc

from roll_lightning.env_client.client import EnvClient
from roll_lightning.env_client.errors import EpisodeFailed

Kind = Literal["reset", "step"]
Pending = tuple[Any, "asyncio.Future[Any]", float]  # request, caller's future, absolute deadline
Send = Callable[[list[Any], float], Awaitable[list[Any]]]


class Batcher:
    def __init__(
        self, client: EnvClient, address: str, waiting: set[asyncio.Future[Any]], *, max_batch: int, max_inflight: int
    ) -> None:
        """``waiting``: the endpoint's futures that an ejection fails at once (shared with the pool)."""
        self.client, self.address, self.waiting = client, address, waiting
        self.max_batch, self.max_inflight = max_batch, max_inflight
        self.queues: dict[Kind, list[Pending]] = {"reset": [], "step": []}
        self.wakeups: dict[Kind, asyncio.Event] = {"reset": asyncio.Event(), "step": asyncio.Event()}
        self.batches = 0  # RPCs sent
        self.items = 0  # calls they carried

    async def call(self, kind: Kind, request: Any, timeout: float) -> Any:
        """Queue one call for the next ``kind`` batch and wait for its result (hot path: no extra Task)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + timeout
        self.queues[kind].append((request, fut, deadline))
        self.wakeups[kind].set()
        self.waiting.add(fut)
        timer = loop.call_at(deadline, _expire, fut, self.address, request.session_id, timeout)
        try:
            return await fut
        finally:
            timer.cancel()
            self.waiting.discard(fut)
            if not fut.done():
                fut.cancel()  # the flusher skips it

    async def flush_forever(self, kind: Kind) -> None:
        """Send ``kind``'s queue in batches until cancelled."""
        inflight = asyncio.Semaphore(self.max_inflight)
        queue, wakeup = self.queues[kind], self.wakeups[kind]
        # batch_mixed also resends resets an older server ignored
        send: Send = self.client.batch_reset if kind == "reset" else self.client.batch_mixed
        sending: list[asyncio.Task[None]] = []
        try:
            while True:
                await wakeup.wait()
                await inflight.acquire()  # meanwhile new calls pile up for the next batch
                await asyncio.sleep(0)
                batch = [item for item in queue[: self.max_batch] if not item[1].done()]  # done = caller gave up
                del queue[: self.max_batch]
                if not queue:
                    wakeup.clear()
                if not batch:
                    inflight.release()
                    continue
                self.batches += 1
                self.items += len(batch)
                timeout = max(0.001, min(deadline for _, _, deadline in batch) - asyncio.get_running_loop().time())
                sending = [t for t in sending if not t.done()]
                sending.append(asyncio.create_task(_send_batch(send, batch, timeout, inflight)))
        finally:  # batches still out are cancelled, their callers told so
            for task in sending:
                task.cancel()
            await asyncio.gather(*sending, return_exceptions=True)


async def _send_batch(send: Send, batch: list[Pending], timeout: float, inflight: asyncio.Semaphore) -> None:
    try:
        results = await send([req for req, _, _ in batch], timeout)
        for (_, fut, _), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
    except BaseException as err:  # every caller gets an answer
        for req, fut, _ in batch:
            if fut.done():
                continue
            if isinstance(err, EpisodeFailed):
                fut.set_exception(EpisodeFailed(err.code, err.detail, endpoint=err.endpoint, session_id=req.session_id))
            else:
                fut.set_exception(EpisodeFailed(grpc.StatusCode.CANCELLED, f"batch not delivered: {err!r}"))
        if not isinstance(err, Exception):
            raise
    finally:
        inflight.release()


def _expire(fut: asyncio.Future[Any], address: str, session_id: str, timeout: float) -> None:
    if not fut.done():
        fut.set_exception(
            EpisodeFailed(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no answer within {timeout:.1f}s",
                endpoint=address,
                session_id=session_id,
            )
        )
