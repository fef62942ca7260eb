"""`GenerationGate`: every reply an episode asks for passes here, so generation can be held for a weight load or
an engine sleep, and no reply comes from half-loaded weights.

`close` (the scheduler's suspend) stops new replies. What happens to the ones in flight is
``data.rollout.on_suspend``: ``wait`` waits for them to finish; ``abort`` cancels them (each engine call runs as
its own task, so only the request is cancelled, never the episode) and returns at once, and `generate` asks each
of those turns again, from the same prompt, once `open` is called, with the weights loaded meanwhile. An
aborted reply is never returned, so no partial tokens reach an episode and the env is stepped once per turn,
with a whole reply. Async and lock-step collection both generate through the gate.
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
        """``counters``: where ``turns_aborted`` (replies a `close` cancelled) is counted."""
        self.engine, self.on_suspend, self.counters = engine, on_suspend, counters
        self.counters.setdefault("turns_aborted", 0)
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._requests: set[asyncio.Future[Generation]] = set()  # engine calls in flight (abort mode)
        self._aborted: set[asyncio.Future[Generation]] = set()  # of those, the ones `close` cancelled
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def generating(self) -> int:
        """Replies in flight now (requested from the engine, not yet answered)."""
        return self._in_flight

    async def close(self) -> None:
        """Hold new replies; wait for, or (``abort``) cancel, the ones in flight. None is in flight on return."""
        self._open.clear()
        if self.on_suspend == "abort":
            for request in list(self._requests):
                if request.cancel():
                    self._aborted.add(request)
                    self.counters["turns_aborted"] += 1
        await self._drained.wait()

    def open(self) -> None:
        """Let replies go on (aborted turns are asked again now)."""
        self._open.set()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """A whole reply from the engine, once the gate is open. A reply `close` cancelled is asked again, from
        the same prompt, when the gate reopens (``extra["redone"]`` says how many times; 0 is left out)."""
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
                    request.cancel()  # this call itself was cancelled (group dropped, turn deadline); else a no-op
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._drained.set()
            if not (aborted and request.cancelled()):
                generation = request.result()  # the engine's own error (or a cancellation not ours) raises here
                if redone:
                    generation = replace(generation, extra={**generation.extra, "redone": redone})
                return generation
            redone += 1  # cancelled by `close`: ask again once the gate reopens
