"""`WorldStop`: a SIGTERM (or Ctrl-C) on any rank stops every rank at the same step, on one node or many.

A cluster launcher may signal one node only, and no rank may leave while another waits for it in a collective.
So, with more than one rank:
- the signalled rank announces the stop in the process group's key-value store (the rendezvous every rank
  reached at start-up), and abandons its rollout in flight;
- every rank's rollout loop polls the store (`watch`) and, on an announcement, abandons its own rollout the same
  way: the stop takes about a poll interval to reach the other nodes, not a whole rollout;
- before any batch is used (training or evaluation) the ranks agree in one all-reduce (`agree`) whether one of them
  is stopping or failed; then all of them raise at that same step. The last checkpoint is the last step every
  rank completed, so ``--ckpt_path last`` resumes them all.

Lightning's own SIGTERM notifier broadcasts from inside the signal handler, a collective the other ranks are not
in (both nodes then wait forever); `quiet_lightning_notifier` turns it off for runs with more than one rank.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from roll_lightning.rollout.loop import RolloutLoop

log = logging.getLogger(__name__)

KEY = "roll_lightning/stop"
GO, STOPPING, FAILED = 0, 1, 2  # what a rank brings to `agree` (the largest wins)


class PeerRankFailed(RuntimeError):
    """Another rank stopped with an error (its own log says which): this rank stops at the same step."""


class WorldStop:
    def __init__(self, device: torch.device, poll_s: float = 0.5) -> None:
        from torch.distributed import distributed_c10d

        self.store = distributed_c10d._get_default_store()  # the rendezvous store every rank is connected to
        self.device, self.poll_s = device, poll_s

    def announce(self, signum: int) -> None:
        """Tell the other ranks (from the signal handler: the store call runs on its own thread)."""
        threading.Thread(target=self.store.set, args=(KEY, str(signum)), name="world-stop", daemon=True).start()

    def announced(self) -> int:
        """The signal some rank announced, or 0."""
        return int(self.store.get(KEY)) if self.store.check([KEY]) else 0

    async def watch(self, loop: RolloutLoop) -> None:
        """Abandon this rank's rollout in flight once another rank has announced a stop (runs on the loop)."""
        while not loop.terminating:
            await asyncio.sleep(self.poll_s)
            try:
                signum = await asyncio.to_thread(self.announced)
            except Exception:  # the store lives on rank 0, which may already have left at the end of a run
                return
            if signum and not loop.terminating:
                log.warning("another rank received %s: stopping this rank too", signal.Signals(signum).name)
                loop.stop(signum)

    def agree(self, mine: int) -> int:
        """Every rank's `GO`/`STOPPING`/`FAILED`, reduced to the largest (a collective: every rank calls it)."""
        flag = torch.tensor([mine], dtype=torch.int32, device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return int(flag.item())


def quiet_lightning_notifier(trainer: Any) -> None:
    """Keep Lightning's SIGTERM notifier from broadcasting inside the signal handler (see the module docstring).

    Called before ``fit`` registers its handlers, which pick the notifier up from the connector. The stop itself
    is `WorldStop`'s."""

    def notifier(signum: int, frame: Any) -> None:
        log.info("rank %d received signal %d", trainer.global_rank, signum)

    trainer._signal_connector._sigterm_notifier_fn = notifier
