"""`WeightSync`: after every policy update, the engine generates with the new weights.

Each rank owns an engine (colocated generation), so every rank needs the full weights: under FSDP2 each
parameter is gathered with ``full_tensor()`` (a collective all ranks join, one tensor at a time, so peak memory
is one full tensor more than the shards); without sharding the state dict is used as it is. The engine's policy
version becomes the number of rollout steps trained, which is what staleness is measured against.

The engine starts from the model folder, so after a checkpoint is restored (``fit --ckpt_path``, ``validate
--ckpt_path``) it is behind the module: the weights are loaded once more before training or evaluation starts.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's full (unsharded) weights on CPU, on every rank."""
    out = {}
    for name, value in model.state_dict().items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = tensor.detach().to("cpu", copy=True)
    return out


class WeightSync(L.Callback):
    """Loads the actor's weights into the rollout engine after each training step (added by the module itself,
    so a config cannot drop it)."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        timings = self._sync(trainer, pl_module)
        if timings is not None:
            pl_module.log_dict(timings, on_step=True, batch_size=1)

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._catch_up(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._catch_up(trainer, pl_module)

    def _catch_up(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Load the module's weights if the engine has older ones (a restored checkpoint); every rank decides
        alike, since the versions are the same on all of them."""
        engine = getattr(trainer.datamodule, "engine", None)
        if engine is not None and engine.policy_version != pl_module.rollout_steps:
            behind = engine.policy_version
            self._sync(trainer, pl_module)
            log.warning(
                "WeightSync: the engine had policy version %d; loaded the restored %d", behind, engine.policy_version
            )

    def _sync(self, trainer: L.Trainer, pl_module: Any) -> dict[str, float] | None:
        datamodule = trainer.datamodule
        engine = getattr(datamodule, "engine", None)
        if engine is None or pl_module.actor is None:
            return None
        started = time.perf_counter()
        weights = full_state_dict(pl_module.actor)
        gathered = time.perf_counter()
        version = int(pl_module.rollout_steps)
        scheduler = datamodule.scheduler

        async def sync() -> None:
            await scheduler.suspend()  # no reply may come from half-loaded weights
            await engine.wake()
            await engine.load_weights(weights, version)
            await scheduler.resume()  # groups now too stale for `version` are dropped here

        datamodule.call(sync())
        done = time.perf_counter()
        return {
            "sync/total_s": done - started,
            "sync/gather_s": gathered - started,
            "sync/load_s": done - gathered,
            "sync/policy_version": float(version),
            "sync/bytes": float(sum(t.numel() * t.element_size() for t in weights.values())),
        }
