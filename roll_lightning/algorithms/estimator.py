"""What an advantage estimator is: a small object, chosen once from ``model.algorithm.estimator``, that says
what it needs and turns a batch's rows into advantages.

The three estimators live one per file with their equation on line 1: `grpo.GRPO`, `gigpo.GiGPO`,
`ppo_gae.PPOGAE`. Each declares what the rest of the trainer must give it:

- ``needs_groups``: it compares the members of a group, so ``data.rollout.group_size`` must be >= 2;
- ``needs_step_rows``: it groups single turns, so ``data.rollout.episode.layout`` must be ``step``;
- ``uses_critic``: the module builds a critic and passes its values (and trains it on the returns).

`training.estimate` maps a `RolloutBatch` onto `AdvantageInputs` and checks those needs in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """A batch's rows as the estimators take them (integer ids: only equality matters, see `grouping`).

    ``[B]``: episode_scores (the episode's return), step_scores (the row's own turn reward), group_ids,
    traj_ids, step_index. ``[B, L]``: token_scores (each turn's reward on its last reply token),
    response_mask. ``anchors`` (``[B]`` anchor-state ids) is set for an estimator that ``needs_step_rows``;
    ``values`` (``[B, L]``, the critic's) for one that ``uses_critic``.
    """

    episode_scores: Tensor
    step_scores: Tensor
    token_scores: Tensor
    response_mask: Tensor
    group_ids: Tensor
    traj_ids: Tensor
    step_index: Tensor
    anchors: Tensor | None = None
    values: Tensor | None = None


class Estimator(ABC):
    """An advantage estimator: its needs (class attributes) and ``__call__``, which returns
    ``(advantages, returns)``: per row ``[B]`` or per token ``[B, L]``, and the value targets (critic only)."""

    name: ClassVar[str]
    needs_groups: ClassVar[bool] = False
    needs_step_rows: ClassVar[bool] = False
    uses_critic: ClassVar[bool] = False

    @abstractmethod
    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, Tensor | None]: ...
