"""Per-instance copies of Python's and numpy's process-global RNGs, for third-party envs that use them.

GEM and TextArena draw from the global `random` (GEM also `numpy.random`), so interleaved sessions would diverge
from the same seed. `GlobalRng.run` swaps an env's own states in under a process-wide lock.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
_LOCK = threading.Lock()


class GlobalRng:
    """One env's private copy of the two global RNG states."""

    def __init__(self) -> None:
        self._states = (random.getstate(), np.random.get_state())

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with this env's states swapped in."""
        with _LOCK:
            outside = random.getstate(), np.random.get_state()
            random.setstate(self._states[0])
            np.random.set_state(self._states[1])
            try:
                return fn(*args, **kwargs)
            finally:
                self._states = (random.getstate(), np.random.get_state())
                random.setstate(outside[0])
                np.random.set_state(outside[1])
