"""`GenerationGate`: every reply passes here, so generation can be held for a weight load or an engine sleep.
What happens to the replies in flight is ``on_suspend``'s choice: ``wait`` lets them finish on the old weights,
``abort`` cancels them and asks them again on reopening, ``keep`` stops them where they are and, on reopening,
continues each from its prompt + the tokens it kept, under the new weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

from roll_lightning.rollout.config.rollout import OnSuspend
from roll_lightning.rollout.engines.base import (
    Generation,
    GenerationEngine,
    Interruptible,
    SamplingParams,
    joined,
    mark_seen,
)


class GenerationGate:
    def __init__(self, engine: GenerationEngine, on_suspend: OnSuspend, counters: dict[str, float]) -> None:
        """``counters``: gets ``turns_aborted`` and ``turns_kept``."""
        if on_suspend == "keep" and not isinstance(engine, Interruptible):
            raise ValueError(
                f"data.rollout.on_suspend: keep needs an engine that can stop its replies where they are; "
                f"{type(engine).__name__} cannot (use wait or abort)"
            )
        self.engine, self.on_suspend, self.counters = engine, on_suspend, counters
        self.counters.setdefault("turns_aborted", 0)
        self.counters.setdefault("turns_kept", 0)
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._requests: set[asyncio.Future[Generation]] = set()  # engine calls in flight (abort mode)
        self._aborted: set[asyncio.Future[Generation]] = set()  # the ones `close` cancelled
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def generating(self) -> int:
        return self._in_flight

    async def close(self) -> None:
        """Hold new replies; wait for, cancel (``abort``) or stop (``keep``) the ones in flight."""
        self._open.clear()
        if self.on_suspend == "abort":
            for request in list(self._requests):
                if request.cancel():
                    self._aborted.add(request)
                    self.counters["turns_aborted"] += 1
        elif self.on_suspend == "keep" and self._in_flight:
            await self.engine.interrupt()  # type: ignore[attr-defined]  # checked in __init__
        await self._drained.wait()

    def open(self) -> None:
        """Let replies go on."""
        self._open.set()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """A whole reply once the gate is open (``extra["redone"]``: times a suspend cancelled it; ``keep``:
        ``extra["versions"]`` where a suspend changed the weights under it)."""
        if self.on_suspend == "keep":
            return await self._generate_kept(prompt_ids, params, key)
        redone = 0
        while True:
            await self._open.wait()
            self._started()
            try:
                if self.on_suspend == "wait":
                    return await self.engine.generate(prompt_ids, params, key=key)
                request = asyncio.ensure_future(self.engine.generate(prompt_ids, params, key=key))
                request.add_done_callback(mark_seen)
                self._requests.add(request)
                try:
                    await asyncio.wait([request])  # not `await request`: `close` cancels the request only
                finally:
                    self._requests.discard(request)
                    aborted = request in self._aborted
                    self._aborted.discard(request)
                    request.cancel()  # a no-op unless this call was cancelled (group dropped, deadline)
            finally:
                self._finished()
            if not (aborted and request.cancelled()):
                generation = request.result()  # the engine's error, or a cancellation not ours, raises
                if redone:
                    generation = replace(generation, extra={**generation.extra, "redone": redone})
                return generation
            redone += 1

    async def _generate_kept(self, prompt_ids: Sequence[int], params: SamplingParams, key: str) -> Generation:
        """Ask, and after each suspend that stopped the reply, ask on from prompt + what it kept."""
        pieces: list[Generation] = []
        kept: list[int] = []
        while True:
            await self._open.wait()
            self._started()
            try:
                left = params.max_new_tokens - len(kept)
                piece = await self.engine.generate([*prompt_ids, *kept], params.replace(max_new_tokens=left), key=key)
            finally:
                self._finished()
            pieces.append(replace(piece, prompt_tokens=len(prompt_ids)))
            kept += piece.token_ids
            if piece.finish_reason != "abort":
                return joined(pieces)
            self.counters["turns_kept"] += 1
            if len(kept) >= params.max_new_tokens:
                return replace(joined(pieces), finish_reason="length")

    def _started(self) -> None:
        self._in_flight += 1
        self._drained.clear()

    def _finished(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._drained.set()
