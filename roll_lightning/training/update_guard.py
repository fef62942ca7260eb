"""``model.algorithm.max_update_kl``: an update that moved the policy too far is undone (a trust region by rejection).

On the CPU Sokoban recipe every burst of invalid replies (and the 0% held-out event) began with one update whose
``train/ppo_kl`` was 0.1-2 nats, against about 1e-3 otherwise (docs/benchmarks.md, issue 46). The PPO clip
cannot stop that: it acts on the ratio only after the first optimiser step has moved it.
This measures the KL after the whole update, on the batch's own reply tokens, and restores the weights and the
optimiser state from before the update when it is above the bound.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from roll_lightning.algorithms.losses import kl_k3


def update_kl(old_logp: torch.Tensor, new_logp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """``(sum, count)`` of k3 ``KL(old || new)`` over the reply tokens: ``r - 1 - log r``, ``r = p_new / p_old``
    (Schulman's low-variance estimator, >= 0); sums, so ranks add theirs up before dividing."""
    m = mask.bool()
    per_token = kl_k3(old_logp.detach().float(), new_logp.detach().float())
    return float(torch.where(m, per_token, 0).sum()), float(m.sum())


def _trainable(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters an update changes (frozen ones, LoRA's base, never do), each rank's shards: FSDP2 leaves the
    root's weights gathered after a forward, and writing to those would be lost at the next reshard."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()
    return [p for p in module.parameters() if p.requires_grad]


@dataclass
class Snapshot:
    """The trainable parameters and the optimiser's state, as they were before an update (on each rank, its own
    shards)."""

    params: list[torch.Tensor]
    optimizer: dict[str, Any]

    @classmethod
    def take(cls, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Snapshot:
        with torch.no_grad():
            params = [p.detach().clone() for p in _trainable(module)]
        return cls(params, copy.deepcopy(optimizer.state_dict()))

    def restore(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for p, saved in zip(_trainable(module), self.params, strict=True):
                p.copy_(saved)
        optimizer.load_state_dict(self.optimizer)
