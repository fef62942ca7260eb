"""Episodes handed to long-running agent programs (``agent.lifetime: run``): the trainer offers each episode's
key and task, an agent takes it with a long poll (``GET /agent/next``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

MAX_WAIT_S = 60.0  # the longest a `GET /agent/next` is held open


class Handout:
    """A queue of offered episodes that agents take in order; `close` ends every poll, now and later."""

    def __init__(self) -> None:
        self._offered: deque[tuple[str, dict[str, Any]]] = deque()
        self._changed = asyncio.Condition()
        self.closed = False
        self.polls = 0  # agents waiting in `take` now

    async def offer(self, key: str, task: dict[str, Any]) -> None:
        async with self._changed:
            self._offered.append((key, task))
            self._changed.notify()

    def withdraw(self, key: str) -> None:
        """Forget an episode nobody took (it was cancelled or timed out)."""
        self._offered = deque(item for item in self._offered if item[0] != key)

    async def take(self, wait_s: float) -> tuple[str, dict[str, Any]] | None:
        """The next offered episode, waiting up to ``wait_s``; None when none came or the handout is closed."""
        self.polls += 1
        try:
            async with self._changed:
                try:
                    async with asyncio.timeout(min(wait_s, MAX_WAIT_S)):
                        await self._changed.wait_for(lambda: self._offered or self.closed)
                except TimeoutError:
                    return None
                return None if self.closed else self._offered.popleft()
        finally:
            self.polls -= 1

    async def close(self) -> None:
        async with self._changed:
            self.closed = True
            self._changed.notify_all()
