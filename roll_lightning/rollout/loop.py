"""`RolloutLoop`: the asyncio loop the rollout lives on, in its own thread, and the bridge from signals to it.

Everything of the rollout (env pool, engine, scheduler) runs on this loop; the training loop and the callbacks
reach it through `call`, which runs a coroutine there and waits for its result.

SIGTERM (a scheduler's preemption, ``kill``) abandons the rollout in flight instead of waiting for it: a CPU
rollout can take minutes. A call marked ``interruptible`` (training batches, evaluation) is cancelled and raises
Lightning's `SIGTERMException`; its groups were not trained on and are in no checkpoint, so ``--ckpt_path last``
plays them again. The handler is chained in front of the one already installed (Lightning's, which stops between
steps), so a SIGTERM during a training step waits for the step to finish. SIGINT (Ctrl-C) takes the same path:
the CLI hands it to this handler (`roll_lightning.exits`). With several ranks, a signal to any of them stops all
at the same step (`roll_lightning.rollout.world_stop`).
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
    from roll_lightning.rollout.world_stop import WorldStop

log = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutLoop:
    def __init__(self, name: str) -> None:
        """Start the loop in a daemon thread called ``name``, and chain the SIGTERM handler (main thread only)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._inflight: concurrent.futures.Future[Any] | None = None
        self.terminating = 0  # the signal that is stopping the run (SIGTERM, or SIGINT passed on by the CLI)
        self.world_stop: WorldStop | None = None  # with several ranks: tells them of a signal (`world_stop`)
        self._restore: Any = None
        self._install_sigterm_handler()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, interruptible: bool = False) -> T:
        """Run a coroutine on the loop from any other thread and wait for its result.

        ``interruptible``: SIGTERM cancels the call, in flight or yet to start, and it raises `SIGTERMException`.
        Other calls (teardown's among them) always run to the end.
        """
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
        """Stop as ``signum`` asks: the interruptible call in flight, or the next one, raises `SIGTERMException`."""
        self.terminating = signum
        inflight = self._inflight
        if inflight is not None:
            inflight.cancel()

    def close(self) -> None:
        """Give SIGTERM back to the handler before ours, stop the loop and its thread."""
        if self._restore is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._restore)
            self._restore = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    def _install_sigterm_handler(self) -> None:
        """Chain a SIGTERM handler in front of the current one (Lightning's, which stops between steps)."""
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; the default behaviour stays
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:
            return  # whoever started us chose to ignore SIGTERM

        def on_sigterm(signum: int, frame: Any) -> None:
            inflight = self._inflight
            self.stop(signum)
            if self.world_stop is not None:  # several ranks: all stop together at the next batch, none exits here
                self.world_stop.announce(signum)
            if callable(previous):
                previous(signum, frame)
            elif inflight is None and self.world_stop is None:  # nothing to cancel: the default action, but clean
                raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._restore = previous
