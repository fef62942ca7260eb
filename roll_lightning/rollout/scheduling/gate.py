"""`GenerationGate`: every reply passes here, so generation can be held for a weight load or an engine sleep;
``abort`` cancels replies in flight and asks them again on reopening.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from roll_lightning.rollout.engines.base import Generation, GenerationEngine, SamplingParams, mark_seen


class GenerationGate:
    def __init__(
        self, engine: GenerationEngine, on_suspend: Literal["wait", "abort"], counters: dict[str, float]
    ) -> None:
        """``counters``: gets ``turns_aborted``."""
        self.engine, self.on_suspend, self.counters = engine, on_suspend, counters
        self.counters.setdefault("turns_aborted", 0)
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
        """Hold new replies; wait for, or (``abort``) cancel, the ones in flight."""
        self._open.clear()
        if self.on_suspend == "abort":
            for request in list(self._requests):
                if request.cancel():
                    self._aborted.add(request)
                    self.counters["turns_aborted"] += 1
        await self._drained.wait()

    def open(self) -> None:
        """Let replies go on."""
        self._open.set()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """A whole reply once the gate is open; one `close` cancelled is asked again (``extra["redone"]`` counts)."""
        redone = 0
        while True:
            await self._open.wait()
            self._in_flight += 1
            self._drained.clear()
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
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._drained.set()
            if not (aborted and request.cancelled()):
                generation = request.result()  # the engine's error, or a cancellation not ours, raises
                if redone:
                    generation = replace(generation, extra={**generation.extra, "redone": redone})
                return generation
            redone += 1
