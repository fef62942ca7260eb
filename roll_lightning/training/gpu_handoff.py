"""`GPUHandoff`: generation and training take turns on the same accelerator (colocated and partial-overlap runs).

What happens when is decided once per run by `plan_handoff`, a pure function of the accelerator and
``data.colocate``:

| accelerator | colocate | before the rollout      | after the rollout                          | after the update |
|-------------|----------|-------------------------|--------------------------------------------|------------------|
| cuda        | true     | optimiser state -> CPU  | suspend, engine sleeps, state -> GPU, sync | engine wakes     |
| cuda        | false    | nothing                 | nothing (generation goes on, staleness)     | nothing          |
| cpu         | true     | nothing                 | suspend, engine sleep (a no-op on CPU)     | engine wake      |
| cpu         | false    | nothing                 | nothing                                    | nothing          |
| cuda        | partial  | optimiser state -> CPU  | shrink `train` replicas, state -> GPU, sync | expand them      |
| cpu         | partial  | nothing                 | shrink `train` replicas                    | expand them      |

Partial overlap (``data.colocate: partial``, ROLL's shrink/expand sampler): the replicas on the training device
(``train`` in ``data.engine.devices``) are shrunk when the batch is in (their replies in flight are asked again
of the other replicas, which keep generating within ``max_staleness``; they sleep, freeing the device), and
expanded after the update; they serve again once `WeightSync`'s load, which follows at once, gave them the new
weights.

The optimiser state goes to the CPU only when the engine needs the memory (colocated on a GPU), and comes
back before every optimiser step. The module's `training_step` calls the three columns in order
(`before_rollout`, `to_training`, `to_generation`), the last before `WeightSync` loads the new weights.
``data.colocate`` is the datamodule's setting, read here only. Device operations go through `DeviceOps`, so
tests run the CUDA rows on a CPU with a recording stand-in.
"""

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
    """What the handoff does in a run (see the module's table)."""

    offload_optimizer: bool  # optimiser state to the CPU while generating, back before the update
    sleep_engine: bool  # the engine is suspended and sleeps while the policy trains; woken for the weight sync
    shrink_shared: bool = False  # the `train` replicas step aside for the update; the others keep generating

    @property
    def synchronize(self) -> bool:
        return self.offload_optimizer  # wait for the state to be back before the optimiser reads it


def plan_handoff(accelerator: str, colocate: bool | str) -> HandoffPlan:
    """The handoff for a run that trains on ``accelerator`` with generation colocated, partly (``"partial"``)
    or not."""
    if colocate == "partial":
        return HandoffPlan(offload_optimizer=accelerator == "cuda", sleep_engine=False, shrink_shared=True)
    return HandoffPlan(offload_optimizer=bool(colocate) and accelerator == "cuda", sleep_engine=bool(colocate))


class GPUHandoff(L.Callback):
    """Acts when the rollout is colocated (``data.colocate: true``, the default) or partly colocated
    (``partial``). Registered by the module as a callback (so a test can find it and swap its ``ops``); its
    steps are called by the module's `training_step`."""

    def __init__(self, ops: DeviceOps | None = None) -> None:
        self.ops: DeviceOps = ops or TorchDeviceOps()
        self._warned = False

    def plan(self, trainer: L.Trainer, pl_module: L.LightningModule) -> HandoffPlan:
        rollout = rollout_of(trainer)
        colocate = rollout.colocate if rollout is not None else False  # no rollout: nothing to hand over
        return plan_handoff(torch.device(self.ops.device(pl_module)).type, colocate)

    def before_rollout(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The engine gets the memory while it generates: the optimiser state goes to the CPU (colocated CUDA)."""
        if self.plan(trainer, pl_module).offload_optimizer:
            for optimizer in trainer.optimizers:
                self.ops.move_optimizer_state(optimizer, "cpu")

    def to_training(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: RolloutBatch) -> None:
        """Between the rollout and the update: generation suspends and the engine sleeps (or the shared replicas
        shrink), and the optimiser state comes back to the device."""
        datamodule = rollout_of(trainer)
        plan = self.plan(trainer, pl_module)
        if datamodule is None or not (plan.sleep_engine or plan.shrink_shared):
            return  # disaggregated: generation goes on during training, within the staleness bound
        started = time.perf_counter()
        if plan.shrink_shared:  # the other replicas keep generating
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
        """After the update, before `WeightSync` loads the new weights: wake the engine that slept (colocated),
        or expand the `train` replicas (partial overlap)."""
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
