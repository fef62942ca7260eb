"""PPO-GAE: delta_t = r_t + gamma V_next - V_t, A_t = delta_t + gamma lam A_next, R = A + V (docs/algorithms.md §4).

GAE: Schulman et al. 2015.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import next_rows


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    *,
    gamma: float,
    lam: float,
    next_row: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, 0 off the mask. ``next(t)`` is the next *reply* token: env tokens between turns
    are skipped, not discounted. ``next_row[b]`` is the row that continues row ``b`` (the episode's next turn, as
    step rows are), or -1: a row's last reply token then bootstraps from that row's first, so step rows get the
    advantages of the same episode as one trajectory row. Not whitened (verl whitens)."""
    if not token_rewards.shape == values.shape == response_mask.shape:
        raise ValueError(f"shape mismatch: {token_rewards.shape}, {values.shape}, {response_mask.shape}")
    mask = response_mask.bool()
    dtype = torch.promote_types(values.dtype, torch.float32)  # bf16 values: accumulate in float32
    rewards = torch.where(mask, token_rewards, 0).to(dtype)
    v = torch.where(mask, values, 0).to(dtype)
    rows = v.shape[0]
    if next_row is None:
        next_row = torch.full((rows,), -1, dtype=torch.long)
    next_row = next_row.to(v.device)
    advantages = torch.zeros_like(v)
    head_value = torch.zeros(rows, dtype=dtype, device=v.device)  # each row's carry at its first reply token
    head_adv = torch.zeros_like(head_value)
    done = torch.zeros(rows, dtype=torch.bool, device=v.device)
    has_next = next_row >= 0
    after = next_row.clamp(min=0)
    while not done.all():  # the last turns first, then the turns before them
        ready = ~done & (~has_next | done[after])
        if not ready.any():
            raise ValueError("next_row links form a cycle")
        idx = ready.nonzero().squeeze(1)
        next_value = torch.where(has_next[idx], head_value[after[idx]], 0)
        next_adv = torch.where(has_next[idx], head_adv[after[idx]], 0)
        for t in reversed(range(v.shape[1])):
            here = mask[idx, t]
            delta = rewards[idx, t] + gamma * next_value - v[idx, t]
            adv = delta + gamma * lam * next_adv
            advantages[idx, t] = torch.where(here, adv, 0)
            # off the mask the carried values pass through: this skips the gap
            next_value = torch.where(here, v[idx, t], next_value)
            next_adv = torch.where(here, adv, next_adv)
        head_value[idx], head_adv[idx] = next_value, next_adv
        done[idx] = True
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
        return gae_advantages(
            rows.token_scores, rows.values, rows.response_mask, gamma=self.gamma, lam=self.lam,
            next_row=next_rows(rows.traj_ids, rows.step_index),
        )  # fmt: skip
