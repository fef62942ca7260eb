"""`RolloutLoop`: the rollout's asyncio loop in its own thread, and the SIGTERM bridge: a signal abandons the
rollout in flight rather than wait minutes for it (``--ckpt_path last`` replays its groups).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from roll_lightning.rollout.runtime.world_stop import WorldStop

log = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutLoop:
    def __init__(self, name: str) -> None:
        """Start the loop thread; chain the SIGTERM handler (main thread only)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._inflight: concurrent.futures.Future[Any] | None = None
        self.terminating = 0  # the signal stopping the run (0: none)
        self.world_stop: WorldStop | None = None  # with several ranks
        # while a trainer's steps run, a signal outside a rollout waits for the step to finish (Lightning raises
        # `SIGTERMException` between steps, or the next rollout does), so no step is cut short and left unsaved
        self.stop_between_steps = False
        self._restore: Any = None
        self._install_sigterm_handler()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, interruptible: bool = False) -> T:
        """Run ``coro`` on the loop and wait; a signal cancels an ``interruptible`` call (`SIGTERMException`)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        if not interruptible:
            return future.result(timeout)
        self._inflight = future
        try:
            if self.terminating:  # the signal came before this call was registered
                future.cancel()
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            if not self.terminating:
                raise
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            name = signal.Signals(self.terminating).name
            log.warning("%s: abandoned the rollout in flight; `--ckpt_path last` plays its groups again", name)
            raise SIGTERMException(128 + self.terminating) from None
        finally:
            self._inflight = None

    def stop(self, signum: int) -> None:
        """The interruptible call, now or next, raises `SIGTERMException`."""
        self.terminating = signum
        inflight = self._inflight
        if inflight is not None:
            inflight.cancel()

    def close(self) -> None:
        """Restore the previous SIGTERM handler; stop the loop."""
        if self._restore is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._restore)
            self._restore = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def _install_sigterm_handler(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # handlers can only be set from the main thread
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:
            return  # whoever started us chose to ignore SIGTERM

        def on_sigterm(signum: int, frame: Any) -> None:
            inflight = self._inflight
            self.stop(signum)
            if self.world_stop is not None:  # several ranks: all stop at the next batch, none exits here
                self.world_stop.announce(signum)
            if callable(previous):
                previous(signum, frame)
            elif inflight is None and self.world_stop is None and not self.stop_between_steps:
                raise SystemExit(128 + signum)  # nothing to cancel, no step to finish: the default action, but clean

        signal.signal(signal.SIGTERM, on_sigterm)
        self._restore = previous
