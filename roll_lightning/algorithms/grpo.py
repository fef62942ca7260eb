"""GRPO: A_i = (S_i - mean_g S) / (std_g S + eps), one advantage per episode within its group (docs/algorithms.md §2).

Shao et al. 2024 (DeepSeekMath); with ``norm_by_std: false`` it is Dr.GRPO (Liu et al. 2025), ``S_i - mean_g S``.
A group is the episodes played from one seed of one env, so GRPO ``needs_groups`` (group_size >= 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import dense_index, group_normalize


def _first_row_per_traj(group_ids: Tensor, traj_ids: Tensor) -> Tensor:
    """Bool ``[B]``: True on the first row of each (group, trajectory)."""
    key, n = dense_index(group_ids, traj_ids)
    rows = torch.arange(key.numel(), device=key.device)
    first = torch.full((n,), key.numel(), dtype=torch.long, device=key.device).scatter_reduce(0, key, rows, "amin")
    out = torch.zeros(key.numel(), dtype=torch.bool, device=key.device)
    out[first] = True
    return out


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    traj_ids: Tensor | None = None,
) -> Tensor:
    """GRPO outcome advantage per row, ``[B]``:

        A_i = (S_i - mean_g S) / (std_g S + eps)      (norm_by_std, GRPO)
        A_i =  S_i - mean_g S                         (Dr.GRPO)

    scores: ``[B]`` (e.g. ``batch.episode_scores``); group_ids: ``[B]`` int (same initial state = same group).
    Conventions:
    - Statistics are over *trajectories*: with ``traj_ids`` (step rows, several rows per episode) each
      (group, trajectory) contributes one value, its first row's score. verl-agent's default
      (``compute_mean_std_cross_steps=True``) instead counts a T-step trajectory T times; omit ``traj_ids``
      to get that (or for trajectory rows, where a row is a trajectory).
    - ``std`` is the unbiased (N-1) sample std (``torch.std``); ``eps`` is added to the std, not the variance.
    - Singleton groups (one trajectory) and, with std, groups with ``std <= eps`` give 0 (ROLL's rule;
      verl-agent gives a singleton ``S_i / (1 + eps)``, i.e. no baseline at all).
    """
    group, n = dense_index(group_ids)
    stats_rows = None if traj_ids is None else _first_row_per_traj(group_ids, traj_ids)
    return group_normalize(scores, group, n, norm_by_std=norm_by_std, eps=eps, stats_rows=stats_rows)


@dataclass(frozen=True)
class GRPO(Estimator):
    """``model.algorithm.estimator: grpo``: `grpo_advantages` of the episode scores, each trajectory counted once."""

    name: ClassVar[str] = "grpo"
    needs_groups: ClassVar[bool] = True

    norm_by_std: bool = True

    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, None]:
        advantages = grpo_advantages(
            rows.episode_scores, rows.group_ids, traj_ids=rows.traj_ids, norm_by_std=self.norm_by_std
        )
        return advantages, None
