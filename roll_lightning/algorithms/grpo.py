"""GRPO: A_i = (S_i - mean_g S) / (std_g S + eps), one advantage per episode within its group (docs/algorithms.md §2).

Shao et al. 2024 (DeepSeekMath); ``norm_by_std: false`` is Dr.GRPO (Liu et al. 2025), ``S_i - mean_g S``.
``baseline: batch`` takes g to be the whole batch (ROLL's ``reward_normalization.grouping: batch``): a group whose
episodes all scored alike still gets a signal, negative where it is below the batch's mean.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import dense_index, first_row_per_traj, group_normalize

Baseline = Literal["group", "batch"]


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    traj_ids: Tensor | None = None,
    baseline: Baseline = "group",
) -> Tensor:
    """Per row, ``[B]``; with ``traj_ids`` each trajectory enters the statistics once, else every row does.

    ``baseline``: the mean and std come from the row's group, or from the whole batch.
    """
    if baseline not in ("group", "batch"):
        raise ValueError(f"baseline={baseline!r} must be 'group' or 'batch'")
    group, n = dense_index(group_ids) if baseline == "group" else (torch.zeros_like(group_ids, dtype=torch.long), 1)
    stats_rows = None if traj_ids is None else first_row_per_traj(group_ids, traj_ids)
    return group_normalize(scores, group, n, norm_by_std=norm_by_std, eps=eps, stats_rows=stats_rows)


@dataclass(frozen=True)
class GRPO(Estimator):
    """``model.algorithm.estimator: grpo``."""

    name: ClassVar[str] = "grpo"
    needs_groups: ClassVar[bool] = True

    norm_by_std: bool = True
    baseline: Baseline = "group"

    @classmethod
    def from_settings(cls, settings: Any) -> GRPO:
        return cls(norm_by_std=settings.norm_by_std, baseline=settings.episode_baseline)

    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, None]:
        advantages = grpo_advantages(
            rows.episode_scores,
            rows.group_ids,
            traj_ids=rows.traj_ids,
            norm_by_std=self.norm_by_std,
            baseline=self.baseline,
        )
        return advantages, None
