"""`WorldStop`: a signal to any rank stops every rank at the same step: the signalled rank announces it in the
rendezvous store, the others poll it (`watch`), and all agree before each batch is used (`agree`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from roll_lightning.rollout.runtime.loop import RolloutLoop

log = logging.getLogger(__name__)

KEY = "roll_lightning/stop"
GO, STOPPING, FAILED = 0, 1, 2  # `agree` takes the largest


class PeerRankFailed(RuntimeError):
    """Another rank's rollout failed (its log says why)."""


class WorldStop:
    def __init__(self, device: torch.device, poll_s: float = 0.5) -> None:
        from torch.distributed import distributed_c10d

        self.store = distributed_c10d._get_default_store()
        self.device, self.poll_s = device, poll_s

    def announce(self, signum: int) -> None:
        """Tell the other ranks, off the signal handler's thread."""
        threading.Thread(target=self.store.set, args=(KEY, str(signum)), name="world-stop", daemon=True).start()

    def announced(self) -> int:
        """The signal some rank announced, or 0."""
        return int(self.store.get(KEY)) if self.store.check([KEY]) else 0

    async def watch(self, loop: RolloutLoop) -> None:
        """Abandon this rank's rollout once another rank announces a stop."""
        while not loop.terminating:
            await asyncio.sleep(self.poll_s)
            try:
                signum = await asyncio.to_thread(self.announced)
            except Exception:  # the store lives on rank 0, which may have exited already
                return
            if signum and not loop.terminating:
                log.warning("another rank received %s: stopping this rank too", signal.Signals(signum).name)
                loop.stop(signum)

    def agree(self, mine: int) -> int:
        """The largest of every rank's `GO`/`STOPPING`/`FAILED` (a collective)."""
        flag = torch.tensor([mine], dtype=torch.int32, device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())


def quiet_lightning_notifier(trainer: Any) -> None:
    """Replace Lightning's SIGTERM notifier, a broadcast from the signal handler that the other ranks never join (a
    hang), with a log line. Call before ``fit``."""

    def notifier(signum: int, frame: Any) -> None:
        log.info("rank %d received signal %d", trainer.global_rank, signum)

    trainer._signal_connector._sigterm_notifier_fn = notifier
