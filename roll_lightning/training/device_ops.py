"""`DeviceOps`: the handful of accelerator operations the callbacks perform, behind one seam.

Everything the GPU handoff does to a device goes through this object: which accelerator the policy trains on,
moving optimiser state, waiting for queued copies. `TorchDeviceOps` does it for real; tests pass a recording
stand-in that reports ``"cuda"`` on a CPU machine, so the CUDA branches run (and their order is checked) where
no GPU exists. `bench/gpu_check.py` runs the real thing on a GPU.
"""

from __future__ import annotations

from typing import Protocol

import lightning as L
import torch


class DeviceOps(Protocol):
    def device(self, module: L.LightningModule) -> torch.device | str:
        """The device the policy trains on (its type is the plan's accelerator: ``"cuda"``, ``"cpu"``, ...)."""
        ...

    def move_optimizer_state(self, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
        """Move every tensor of the optimiser's state (AdamW's moments) to ``device``."""
        ...

    def synchronize(self) -> None:
        """Wait until the copies queued on the accelerator are done."""
        ...

    def free_memory(self, device: str) -> int | None:
        """Free bytes on ``device`` (None where it cannot be read: a CPU)."""
        ...


class TorchDeviceOps:
    """The real operations."""

    def device(self, module: L.LightningModule) -> torch.device | str:
        return module.device

    def move_optimizer_state(self, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=True)

    def synchronize(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def free_memory(self, device: str) -> int | None:
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            return None
        torch.cuda.synchronize(device)
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
