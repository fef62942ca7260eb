"""Record what the GPU handoff does in a real fit, pretending the policy trains on CUDA (a device that does not
exist here): `RecordingDeviceOps` is a recording stand-in for `TorchDeviceOps`, named so; the engine's sleep,
wake and weight loads are recorded by wrapping the real engine's methods; the optimiser's steps by a hook.

Used through the CLI, as users run it, so 1 and 2 ranks take the same path:
    --trainer.callbacks+=support.handoff_trace.TraceHandoff --trainer.callbacks.init_args.path OUT
Each rank writes ``OUT.rank<N>.json``: the events in order, and where the optimiser state was at each step.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import lightning as L
import torch

from roll_lightning.rollout.engines import EngineRouter


class RecordingDeviceOps:
    """A recording stand-in for `TorchDeviceOps` that reports ``pretend`` as the accelerator and moves nothing;
    it remembers where the optimiser state would be."""

    def __init__(self, events: list[list[Any]], pretend: str = "cuda") -> None:
        self.events, self.pretend = events, pretend
        self.state_on = "cuda"  # where the optimiser state would live now
        self.reads = 0  # free-memory reads so far

    def device(self, module: L.LightningModule) -> str:
        return self.pretend

    def move_optimizer_state(self, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
        self.state_on = str(device)
        self.events.append(["optimizer_state_to", str(device)])

    def synchronize(self) -> None:
        self.events.append(["synchronize"])

    def free_memory(self, device: str) -> int | None:
        """Pretends the device gains 1 GiB of free memory per call (a shrink reads it before and after)."""
        self.events.append(["free_memory", device])
        self.reads += 1
        return self.reads * 2**30


class TraceHandoff(L.Callback):
    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.events: list[list[Any]] = []
        self.ops = RecordingDeviceOps(self.events)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.device_ops = self.ops

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = trainer.datamodule.engine
        for name in ("sleep", "wake", "load_weights", "shrink", "expand"):
            if hasattr(engine, name):
                setattr(engine, name, self._recorded(f"engine.{name}", getattr(engine, name)))
        if isinstance(engine, EngineRouter):  # partial overlap: which replica sleeps, wakes and loads
            for label, replica in zip(engine.devices, engine.replicas, strict=True):
                for name in ("sleep", "wake", "load_weights"):
                    setattr(replica, name, self._recorded(f"{label}.{name}", getattr(replica, name)))
        for optimizer in trainer.optimizers:
            optimizer.register_step_pre_hook(lambda *_: self.events.append(["optimizer.step", self.ops.state_on]))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.events.append(["step_start"])

    def _recorded(self, name: str, method: Any) -> Any:
        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            self.events.append([name])
            return await method(*args, **kwargs)

        return call

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Path(f"{self.path}.rank{trainer.global_rank}.json").write_text(json.dumps(self.events))
