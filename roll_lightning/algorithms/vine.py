"""Vine: a Monte-Carlo step advantage from the sibling continuations of one state (docs/algorithms.md §9), for
branching rollouts (``data.rollout.branch``), where siblings share an env state by construction.

VinePPO (Kazemnejad et al. 2024, arXiv 2410.01679, §4: ``A(s_t, a_t) = Q̂ - V̂(s_t)`` with ``V̂`` the mean return of
K Monte-Carlo continuations from ``s_t``), with the sibling continuations as those K samples and each one's own
return left out of its baseline (RLOO, Ahmadian et al. 2024), so the baseline does not depend on its action.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.gigpo import discounted_step_returns
from roll_lightning.algorithms.grouping import dense_index, first_row_per_traj

Scale = Literal["reward", "batch_std"]


def leave_one_out_baseline(
    values: Tensor, index: Tensor, num_groups: int, counted: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per row, the mean of its group's counted values but its own, and whether there are any. ``counted``: a
    mask of the rows whose values make the group's (default all); each row's own value must be among them (a
    trajectory's score counted on its first row stands for all its rows)."""
    x = values.detach().to(torch.float64)
    weight = torch.ones_like(x) if counted is None else counted.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=x.device)
    total = zeros.index_add(0, index, x * weight)
    others = zeros.index_add(0, index, weight)[index] - 1
    return (total[index] - x) / others.clamp(min=1), others >= 1


@torch.no_grad()
def vine_advantages(
    episode_scores: Tensor,
    step_rewards: Tensor,
    group_ids: Tensor,
    traj_ids: Tensor,
    step_index: Tensor,
    anchors: Tensor,
    *,
    gamma: float = 1.0,
    scale: Scale = "reward",
    eps: float = 1e-6,
) -> Tensor:
    """Per step row, ``[B]``:

        R_t(i)      = sum_{k>=t} gamma^(k-t) r_k                   the row's return from its state on
        V_-i(s)     = mean of R_t(j), j != i, rows of group g at state s
        A(i)        = R_t(i) - V_-i(s)                              a state with siblings (a fork, the reset)
        A(i)        = R(tau_i) - mean_{j != i} R(tau_j), group g    a state without: the episode's RLOO
        A(i)       <- A(i) / (std_batch(A) + eps)                   scale: batch_std

    A state's rows are those of one group with one anchor; under ``data.rollout.branch`` a fork's siblings share
    an exact anchor, and every member's first step shares the reset's. ``scale: reward`` leaves advantages on the
    reward's scale (VinePPO); ``batch_std`` makes the update's size independent of it with one divisor for the
    batch, so each state keeps its differences in proportion (a per-state std would make two siblings +-1).
    """
    returns = discounted_step_returns(step_rewards, traj_ids, step_index, gamma).to(torch.float64)
    state, n_states = dense_index(group_ids, anchors)
    step_baseline, has_siblings = leave_one_out_baseline(returns, state, n_states)
    scores = episode_scores.detach().to(torch.float64)
    group, n_groups = dense_index(group_ids)
    first = first_row_per_traj(group_ids, traj_ids)  # each trajectory's score enters its group's baseline once
    episode_baseline, has_others = leave_one_out_baseline(scores, group, n_groups, counted=first)
    episode_advantage = torch.where(has_others, scores - episode_baseline, torch.zeros_like(scores))
    advantage = torch.where(has_siblings, returns - step_baseline, episode_advantage)
    if scale == "batch_std" and advantage.numel() > 1:
        advantage = advantage / (advantage.std(unbiased=False) + eps)
    dtype = episode_scores.dtype if episode_scores.is_floating_point() else torch.get_default_dtype()
    return advantage.to(dtype)


@dataclass(frozen=True)
class Vine(Estimator):
    """``model.algorithm.estimator: vine`` (step rows; with ``data.rollout.branch`` for siblings past turn 0)."""

    name: ClassVar[str] = "vine"
    needs_groups: ClassVar[bool] = True
    needs_step_rows: ClassVar[bool] = True

    gamma: float = 1.0
    scale: Scale = "reward"

    @classmethod
    def from_settings(cls, settings: Any) -> Vine:
        return cls(gamma=settings.gigpo_gamma, scale=settings.vine_scale)

    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, None]:
        if rows.anchors is None:
            raise ValueError("vine needs the rows' state ids (AdvantageInputs.anchors)")
        advantages = vine_advantages(
            rows.episode_scores, rows.step_scores, rows.group_ids, rows.traj_ids, rows.step_index, rows.anchors,
            gamma=self.gamma, scale=self.scale,
        )  # fmt: skip
        return advantages, None
