"""PPO-GAE: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next, R = A + V (docs/algorithms.md §4).

GAE: Schulman et al. 2015.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, 0 off the mask. ``next(t)`` is the next *reply* token: env tokens between turns
    are skipped, not discounted. Not whitened (verl whitens)."""
    if not token_rewards.shape == values.shape == response_mask.shape:
        raise ValueError(f"shape mismatch: {token_rewards.shape}, {values.shape}, {response_mask.shape}")
    mask = response_mask.bool()
    dtype = torch.promote_types(values.dtype, torch.float32)  # bf16 values: accumulate in float32
    rewards = torch.where(mask, token_rewards, 0).to(dtype)
    v = torch.where(mask, values, 0).to(dtype)
    advantages = torch.zeros_like(v)
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        here = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - v[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(here, adv, 0)
        # off the mask the carried values pass through: this skips the gap
        next_value = torch.where(here, v[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = torch.where(mask, advantages + v, 0)
    return advantages.to(values.dtype), returns.to(values.dtype)


@dataclass(frozen=True)
class PPOGAE(Estimator):
    """``model.algorithm.estimator: ppo-gae``."""

    name: ClassVar[str] = "ppo-gae"
    uses_critic: ClassVar[bool] = True

    gamma: float = 1.0
    lam: float = 0.95

    @classmethod
    def from_settings(cls, settings: Any) -> PPOGAE:
        return cls(gamma=settings.gamma, lam=settings.lam)

    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, Tensor]:
        if rows.values is None:
            raise ValueError("model.algorithm.estimator=ppo-gae needs the critic's values")
        return gae_advantages(rows.token_scores, rows.values, rows.response_mask, gamma=self.gamma, lam=self.lam)
