"""GiGPO: A = A_E + w A_S, GRPO over episodes plus GRPO over steps from one anchor state (docs/algorithms.md §3).

Feng et al. 2025, arXiv 2505.10978, Eqs. 3-8. The step level compares single turns, so GiGPO
``needs_step_rows`` (``data.rollout.episode.layout: step``) as well as groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import dense_index, group_normalize
from roll_lightning.algorithms.grpo import grpo_advantages


@torch.no_grad()
def discounted_step_returns(step_rewards: Tensor, traj_ids: Tensor, step_index: Tensor, gamma: float) -> Tensor:
    """``R_t = sum_{k>=t} gamma^(k-t) r_k`` within each trajectory (GiGPO Eq. 5), rows in any order, ``[B]``.

    ``step_index`` only orders a trajectory's rows; the exponent counts rows, so a trajectory is its rows (as in
    verl-agent, where only active steps exist). A repeated (traj, step) pair is an error, not a silent
    double count.
    """
    traj = traj_ids.tolist()
    step = step_index.tolist()
    rewards = step_rewards.detach().to(torch.float64).tolist()
    order = sorted(range(len(traj)), key=lambda i: (traj[i], step[i]))
    out = [0.0] * len(traj)
    following: int | None = None  # the row after this one in time, same trajectory
    for i in reversed(order):
        if following is not None and traj[following] == traj[i]:
            if step[following] == step[i]:
                raise ValueError(f"trajectory {traj[i]} has two rows with step {step[i]}")
            out[i] = rewards[i] + gamma * out[following]
        else:
            out[i] = rewards[i]
        following = i
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
) -> Tensor:
    """GiGPO (arXiv 2505.10978, Eqs. 3-8) for step rows (one row per turn), ``[B]``:

        A_E(i) = (R(tau_i) - mean_g R(tau)) / F          episode level, one value per trajectory of group g
        R_t    = sum_{k>=t} gamma^(k-t) r_k                discounted step return within the trajectory
        A_S(i) = (R_t(i) - mean_{g,s} R_t) / F          step level, rows of group g with anchor state s
        A      = A_E + step_weight * A_S

    ``F`` = ``std + eps`` (``norm_by_std``, verl-agent ``mean_std_norm`` / ROLL ``mean_std``) or 1 (``mean_norm``
    / ``mean``; the verl-agent default): the *same* mode at both levels. ``anchors`` are integer anchor-state
    ids (`anchor_ids`); every row with the same (group, anchor) is in one step group, including revisits of a
    state within one trajectory. Degenerate groups (singleton, or std mode with ``std <= eps``) give 0 at
    either level. Invalid-action penalties must already be in ``step_rewards``/``episode_scores``.

    Differences from the references (algorithms.md §3, §6):
    - episode stats: one value per trajectory (``episode_cross_steps=True``: one per row, verl-agent default);
    - episode singleton: 0 here and in ROLL, ``R(tau_i) / (1 + eps)`` in verl-agent;
    - step groups are scoped by (group, anchor) as in verl-agent; ROLL pools equal states across groups;
    - weights: verl-agent ``A_E + w A_S`` (used here); ROLL ``w_E A_E + w_S A_S`` (scale ``A`` for ``w_E``).
    """
    a_episode = grpo_advantages(
        episode_scores,
        group_ids,
        norm_by_std=norm_by_std,
        eps=eps,
        traj_ids=None if episode_cross_steps else traj_ids,
    )
    returns = discounted_step_returns(step_rewards, traj_ids, step_index, gamma)
    step_group, n = dense_index(group_ids, anchors)
    a_step = group_normalize(returns, step_group, n, norm_by_std=norm_by_std, eps=eps)
    return a_episode + step_weight * a_step.to(a_episode.dtype)


@dataclass(frozen=True)
class GiGPO(Estimator):
    """``model.algorithm.estimator: gigpo``: `gigpo_advantages` with ``gigpo_gamma``, ``step_weight`` and
    ``norm_by_std`` from the config."""

    name: ClassVar[str] = "gigpo"
    needs_groups: ClassVar[bool] = True
    needs_step_rows: ClassVar[bool] = True

    gamma: float = 0.95
    step_weight: float = 1.0
    norm_by_std: bool = True

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
        )
        return advantages, None
