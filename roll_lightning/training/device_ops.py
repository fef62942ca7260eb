"""`DeviceOps`: the GPU handoff's device operations, a seam so tests run its CUDA branches on a CPU."""

from __future__ import annotations

from typing import Protocol

import lightning as L
import torch


class DeviceOps(Protocol):
    def device(self, module: L.LightningModule) -> torch.device | str:
        """The device the policy trains on."""
        ...

    def move_optimizer_state(self, optimizer: torch.optim.Optimizer, device: torch.device | str) -> None: ...

    def synchronize(self) -> None: ...

    def free_memory(self, device: str) -> int | None:
        """Free bytes on ``device`` (None on a CPU)."""
        ...


class TorchDeviceOps:
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
