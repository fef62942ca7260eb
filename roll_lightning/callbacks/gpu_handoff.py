"""`GPUHandoff`: generation and training take turns on the same accelerator (colocated runs).

Before the rollout the optimiser state moves to CPU (the engine's KV cache gets the memory); when the rollout
batch is in, generation is suspended and the engine sleeps (vLLM sleep level 1 frees its KV cache and offloads
weights) and the optimiser state comes back. `WeightSync` wakes the engine after the update. Where sleeping is
unsupported (CPUs) the engine logs it and keeps its memory; moving optimiser state is skipped on CPU, where it
would only copy memory to itself.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


class GPUHandoff(L.Callback):
    """Added by the module itself; acts when the rollout is colocated (``data.colocate: true``, the default)."""

    def __init__(self) -> None:
        self._warned = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            for optimizer in trainer.optimizers:
                _move_optimizer_state(optimizer, "cpu")

    def on_rollout_end(self, trainer: L.Trainer, pl_module: Any, batch: Any) -> None:
        datamodule = trainer.datamodule
        engine = getattr(datamodule, "engine", None)
        if engine is None or not getattr(datamodule, "colocate", True):
            return  # disaggregated: generation goes on during training, within the staleness bound
        started = time.perf_counter()

        async def handoff() -> None:
            await datamodule.scheduler.suspend()
            await engine.sleep()

        datamodule.call(handoff())
        if pl_module.device.type == "cuda":
            for optimizer in trainer.optimizers:
                _move_optimizer_state(optimizer, pl_module.device)
            torch.cuda.synchronize()
        elif not self._warned:
            log.info("GPU handoff: training on %s, nothing to hand over", pl_module.device)
            self._warned = True
        pl_module.log("timing/handoff_s", time.perf_counter() - started, on_step=True, batch_size=len(batch))
