"""`ThreadedEngine`: engines whose model is owned by one worker thread.

Commands (weight loads) run there between units of work, so no reply comes from half-loaded weights. Replies go
back to their event loop in one wake-up per unit of work (`_hand_over`), not one per reply: a wake-up is a syscall
and a loop iteration, and a batch of 64 one-token replies paid 64 of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from roll_lightning.rollout.engines.base import EngineClosed, Generation, SamplingParams
from roll_lightning.rollout.prompts.vision import Prompt, images_of


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    key: str
    future: Future[Generation]
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False  # the caller gave up: don't spend compute on it
    epoch: int = 0  # the engine's interrupt count when asked: an `interrupt` since stops it where it is


class ThreadedEngine:
    """Subclasses implement `_work`, `_busy` and `_in_flight`."""

    name = "engine"
    concurrent_loads = True

    def __init__(self) -> None:
        self.policy_version = 0
        self.asleep = False
        self._epoch = 0  # interrupts so far (`interrupt`)
        self._inbox: queue.SimpleQueue[Request | Callable[[], Any] | None] = queue.SimpleQueue()
        self._answered: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[Generation], Future[Generation]]]
        self._answered = deque()  # settled requests not yet handed to their loop (`_hand_over`)
        self._counters = {"requests": 0.0, "generated_tokens": 0.0, "prompt_tokens": 0.0, "busy_s": 0.0}
        self._started = time.perf_counter()
        self._failure: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-worker", daemon=True)

    def _start_worker(self) -> None:
        self._thread.start()

    # -- asyncio side --------------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        self._check_alive()
        prompt = Prompt(prompt_ids, images_of(prompt_ids))  # a copy that keeps the prompt's pictures
        if not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"generate: the prompt must be a non-empty list of token ids, got {prompt[:5]!r}...")
        loop = asyncio.get_running_loop()
        future: Future[Generation] = Future()  # the worker's side
        reply: asyncio.Future[Generation] = loop.create_future()  # the caller's side, settled by `_hand_over`
        future.add_done_callback(lambda _: self._answered.append((loop, reply, future)))
        request = Request(prompt, params, key, future, epoch=self._epoch)
        self._inbox.put(request)
        try:
            return await reply
        except asyncio.CancelledError:
            request.cancelled = True  # the worker drops it (vLLM: aborts it)
            future.cancel()
            raise

    async def interrupt(self) -> None:
        """Stop every reply asked so far where it is: each returns its tokens, ``finish_reason="abort"``."""
        self._epoch += 1  # read by the worker between tokens (an int: no lock needed)

    def _interrupted(self, request: Request) -> bool:
        return request.epoch < self._epoch

    def _stopped_early(self, request: Request, token_ids: list[int], logprobs: list[float]) -> None:
        """Hand back an interrupted reply with what it has."""
        prompt_tokens = len(request.prompt_ids)
        self._done(request, Generation(token_ids, logprobs, "abort", self.policy_version, prompt_tokens=prompt_tokens))

    async def run_on_worker(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread between units of work; return its result."""
        self._check_alive()
        future: Future[Any] = Future()

        def command() -> None:
            try:
                future.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting caller
                future.set_exception(err)

        self._inbox.put(command)
        return await asyncio.wrap_future(future)

    def stats(self) -> dict[str, float]:
        out = dict(self._counters)
        out["uptime_s"] = time.perf_counter() - self._started
        return out

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        await asyncio.to_thread(self._thread.join, 60)

    def _check_alive(self) -> None:
        if self._failure is not None:
            raise EngineClosed(f"{self.name} worker died: {self._failure!r}") from self._failure
        if self._closed:
            raise EngineClosed(f"{self.name} is closed")

    # -- worker side ---------------------------------------------------------------------------------

    def _on_worker_start(self) -> None:
        """Runs first on the worker thread."""

    def _loop(self) -> None:
        pending: list[Request] = []
        try:
            self._on_worker_start()
            while True:
                block = not pending and not self._busy()
                self._hand_over()
                stop = self._drain_inbox(pending, block)
                if stop:
                    break
                if not pending and not self._busy():
                    continue
                new, pending = pending, []
                t0 = time.perf_counter()
                self._work(new)
                self._counters["busy_s"] += time.perf_counter() - t0
        except BaseException as err:  # noqa: BLE001 - recorded, then every waiter is failed with it
            self._failure = err
        finally:
            self._fail_everything(pending)
            self._hand_over()

    def _hand_over(self) -> None:
        """Give every settled request's answer to its event loop: one `call_soon_threadsafe` per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Generation], Future[Generation]]]] = {}
        while self._answered:
            loop, reply, future = self._answered.popleft()
            by_loop.setdefault(loop, []).append((reply, future))
        for loop, answers in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits for these
                loop.call_soon_threadsafe(_settle, answers)

    def _drain_inbox(self, pending: list[Request], block: bool) -> bool:
        """Move requests into ``pending`` and run commands; True when asked to stop."""
        while True:
            try:
                item = self._inbox.get(block=block, timeout=None)
            except queue.Empty:
                return False
            block = False
            if item is None:
                return True
            if isinstance(item, Request):
                if not item.cancelled:
                    pending.append(item)
            else:
                item()

    def _run_batch(self, batch: list[Request], generate: Callable[[list[Request]], list[Generation]]) -> None:
        """Run one batch; an error fails only its requests."""
        try:
            results = generate(batch)
        except Exception as err:  # noqa: BLE001 - delivered to the callers that caused it
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(err)
            return
        for request, generation in zip(batch, results, strict=True):
            self._done(request, generation)

    def _done(self, request: Request, generation: Generation) -> None:
        if request.future.done():  # cancelled by its caller meanwhile
            return
        self._counters["requests"] += 1
        self._counters["generated_tokens"] += len(generation.token_ids)
        self._counters["prompt_tokens"] += len(request.prompt_ids)
        with contextlib.suppress(InvalidStateError):  # cancelled since the check
            request.future.set_result(generation)

    def _fail_everything(self, pending: list[Request]) -> None:
        cause = self._failure or EngineClosed(f"{self.name} is closed")
        for request in pending + self._in_flight():
            if not request.future.done():
                request.future.set_exception(EngineClosed(f"{self.name} stopped: {cause!r}"))
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Request) and not item.future.done():
                item.future.set_exception(EngineClosed(f"{self.name} stopped: {cause!r}"))

    # -- for subclasses ------------------------------------------------------------------------------

    def _work(self, new: list[Request]) -> None:
        raise NotImplementedError

    def _busy(self) -> bool:
        return False

    def _in_flight(self) -> list[Request]:
        return []


def _settle(answers: list[tuple[asyncio.Future[Generation], Future[Generation]]]) -> None:
    """On the event loop: copy each worker-side outcome to the future its caller awaits."""
    for reply, future in answers:
        if reply.done():  # the caller gave up meanwhile
            continue
        if future.cancelled():
            reply.cancel()
        elif (error := future.exception()) is not None:
            reply.set_exception(error)
        else:
            reply.set_result(future.result())
