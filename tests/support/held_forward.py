"""Hold a real engine's worker thread inside a generation, so a test can sync weights mid-reply."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


def hold_at_forward(model: Any, at: int = 3) -> tuple[asyncio.Event, threading.Event]:
    """Wrap ``model.forward``: its ``at``-th call (the prefill is the first, so 3 is two tokens in) sets the first
    event on the running loop, then waits for the second to be set."""
    loop = asyncio.get_running_loop()
    reached, release = asyncio.Event(), threading.Event()
    calls = [0]
    original = model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            loop.call_soon_threadsafe(reached.set)
            release.wait()
        return original(*args, **kwargs)

    model.forward = forward
    return reached, release
