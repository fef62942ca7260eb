"""`GPUHandoff`: generation and training take turns on one accelerator (``data.colocate: true`` or ``partial``)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from roll_lightning.rollout.batch import RolloutBatch
from roll_lightning.rollout.datamodule import rollout_of
from roll_lightning.rollout.engines.placement import TRAIN
from roll_lightning.training.device_ops import DeviceOps, TorchDeviceOps

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandoffPlan:
    offload_optimizer: bool  # optimiser state on the CPU while generating
    sleep_engine: bool
    shrink_shared: bool = False  # the `train` replicas step aside

    @property
    def synchronize(self) -> bool:
        return self.offload_optimizer  # state back before the optimiser reads it


def plan_handoff(accelerator: str, colocate: bool | str) -> HandoffPlan:
    """The optimiser state moves only on CUDA, where the engine needs the memory."""
    if colocate == "partial":
        return HandoffPlan(offload_optimizer=accelerator == "cuda", sleep_engine=False, shrink_shared=True)
    return HandoffPlan(offload_optimizer=bool(colocate) and accelerator == "cuda", sleep_engine=bool(colocate))


class GPUHandoff(L.Callback):
    """A callback only so tests can swap its ``ops``; `training_step` calls its steps."""

    def __init__(self, ops: DeviceOps | None = None) -> None:
        self.ops: DeviceOps = ops or TorchDeviceOps()
        self._warned = False

    def plan(self, trainer: L.Trainer, pl_module: L.LightningModule) -> HandoffPlan:
        rollout = rollout_of(trainer)
        colocate = rollout.colocate if rollout is not None else False
        return plan_handoff(torch.device(self.ops.device(pl_module)).type, colocate)

    def before_rollout(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.plan(trainer, pl_module).offload_optimizer:
            for optimizer in trainer.optimizers:
                self.ops.move_optimizer_state(optimizer, "cpu")

    def to_training(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        """The engine sleeps (or the `train` replicas shrink); the optimiser state comes back."""
        datamodule = rollout_of(trainer)
        plan = self.plan(trainer, pl_module)
        if datamodule is None or not (plan.sleep_engine or plan.shrink_shared):
            return  # disaggregated: generation goes on
        started = time.perf_counter()
        if plan.shrink_shared:
            train_device = str(self.ops.device(pl_module))

            def free_memory(label: str) -> int | None:
                return self.ops.free_memory(train_device if label == TRAIN else label)

            moved = datamodule.call(datamodule.scheduler.shrink_sampler([TRAIN], free_memory=free_memory))
            self._log_moved(pl_module, "shrink", moved, len(batch))
        else:

            async def handoff() -> None:
                await datamodule.scheduler.suspend()
                await datamodule.engine.sleep()

            datamodule.call(handoff())
        if plan.offload_optimizer:
            for optimizer in trainer.optimizers:
                self.ops.move_optimizer_state(optimizer, self.ops.device(pl_module))
        if plan.synchronize:
            self.ops.synchronize()
        elif not self._warned:
            log.info("GPU handoff: training on %s, nothing to hand over", pl_module.device)
            self._warned = True
        pl_module.log("timing/handoff_s", time.perf_counter() - started, on_step=True, batch_size=len(batch))

    def to_generation(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rollout, plan = rollout_of(trainer), self.plan(trainer, pl_module)
        if rollout is None:
            return
        started = time.perf_counter()
        if plan.sleep_engine:
            rollout.call(rollout.engine.wake())
            pl_module.log("timing/wake_s", time.perf_counter() - started, on_step=True, batch_size=1)
        elif plan.shrink_shared:
            moved = rollout.call(rollout.scheduler.expand_sampler([TRAIN]))
            pl_module.log("timing/expand_s", time.perf_counter() - started, on_step=True, batch_size=1)
            self._log_moved(pl_module, "expand", moved, 1)

    @staticmethod
    def _log_moved(pl_module: L.LightningModule, what: str, moved: dict[str, Any], batch_size: int) -> None:
        values = {f"rollout/{what}_replicas": float(len(moved["replicas"]))}
        if what == "shrink":
            values["rollout/shrink_aborted"] = float(moved["aborted"])
            values["rollout/shrink_migrated"] = float(moved["migrated"])
            if moved["released_bytes"] is not None:
                values["rollout/shrink_released_gib"] = moved["released_bytes"] / 2**30
        pl_module.log_dict(values, on_step=True, batch_size=batch_size)
