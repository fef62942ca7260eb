"""GiGPO: A = A_E + w A_S, GRPO over episodes plus GRPO over steps from one anchor state (docs/algorithms.md §3).

Feng et al. 2025, arXiv 2505.10978, Eqs. 3-8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import dense_index, group_normalize, next_rows, time_order
from roll_lightning.algorithms.grpo import Baseline, grpo_advantages


@torch.no_grad()
def discounted_step_returns(step_rewards: Tensor, traj_ids: Tensor, step_index: Tensor, gamma: float) -> Tensor:
    """``R_t = sum_{k>=t} gamma^(k-t) r_k`` within each trajectory (Eq. 5); ``k`` counts rows, as in verl-agent."""
    following = next_rows(traj_ids, step_index).tolist()
    rewards = step_rewards.detach().to(torch.float64).tolist()
    out = [0.0] * len(rewards)
    for i in reversed(time_order(traj_ids, step_index)):  # the latest row of each trajectory first
        out[i] = rewards[i] + (gamma * out[following[i]] if following[i] >= 0 else 0.0)
    return torch.tensor(out, dtype=torch.float64, device=step_rewards.device).to(step_rewards.dtype)


@torch.no_grad()
def gigpo_advantages(
    episode_scores: Tensor,
    step_rewards: Tensor,
    group_ids: Tensor,
    traj_ids: Tensor,
    step_index: Tensor,
    anchors: Tensor,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    episode_cross_steps: bool = False,
    same_turn: bool = False,
    episode_baseline: Baseline = "group",
) -> Tensor:
    """GiGPO (Feng et al. 2025, Eqs. 3-8) for step rows, ``[B]``:

        A_E(i) = (R(tau_i) - mean_g R(tau)) / F       trajectories of group g
        A_S(i) = (R_t(i) - mean_{g,s} R_t) / F        rows of group g at anchor state s
        A      = A_E + step_weight * A_S

    ``F`` is ``std + eps`` or 1; degenerate groups give 0. ``episode_cross_steps``: A_E per row (verl-agent).
    ``same_turn``: the state ``s`` is the anchor and the step index together (time left is part of the state).
    ``episode_baseline: batch``: A_E's mean and std over the whole batch, so flat groups keep a signal; A_S stays
    within anchor groups.
    """
    a_episode = grpo_advantages(
        episode_scores,
        group_ids,
        norm_by_std=norm_by_std,
        eps=eps,
        traj_ids=None if episode_cross_steps else traj_ids,
        baseline=episode_baseline,
    )
    returns = discounted_step_returns(step_rewards, traj_ids, step_index, gamma)
    step_group, n = dense_index(group_ids, anchors, *([step_index] if same_turn else []))
    a_step = group_normalize(returns, step_group, n, norm_by_std=norm_by_std, eps=eps)
    return a_episode + step_weight * a_step.to(a_episode.dtype)


@dataclass(frozen=True)
class GiGPO(Estimator):
    """``model.algorithm.estimator: gigpo``."""

    name: ClassVar[str] = "gigpo"
    needs_groups: ClassVar[bool] = True
    needs_step_rows: ClassVar[bool] = True

    gamma: float = 0.95
    step_weight: float = 1.0
    norm_by_std: bool = True
    same_turn: bool = False
    episode_baseline: Baseline = "group"

    @classmethod
    def from_settings(cls, settings: Any) -> GiGPO:
        return cls(
            gamma=settings.gigpo_gamma,
            step_weight=settings.step_weight,
            norm_by_std=settings.norm_by_std,
            same_turn=settings.gigpo_same_turn,
            episode_baseline=settings.episode_baseline,
        )

    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, None]:
        if rows.anchors is None:
            raise ValueError("GiGPO needs the rows' anchor-state ids (AdvantageInputs.anchors)")
        advantages = gigpo_advantages(
            rows.episode_scores,
            rows.step_scores,
            rows.group_ids,
            rows.traj_ids,
            rows.step_index,
            rows.anchors,
            gamma=self.gamma,
            step_weight=self.step_weight,
            norm_by_std=self.norm_by_std,
            same_turn=self.same_turn,
            episode_baseline=self.episode_baseline,
        )
        return advantages, None
