"""The advantage estimator interface, chosen once from ``model.algorithm.estimator``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor


@dataclass(frozen=True)
class AdvantageInputs:
    """A batch's rows: ``[B]`` scores and ids; ``[B, L]`` token scores, mask and the critic's ``values``."""

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
    """``__call__`` gives ``(advantages, value targets or None)``."""

    name: ClassVar[str]
    needs_groups: ClassVar[bool] = False
    needs_step_rows: ClassVar[bool] = False
    uses_critic: ClassVar[bool] = False

    @classmethod
    def from_settings(cls, settings: Any) -> Estimator:
        """Built from ``model.algorithm``, reading the keys it uses; an estimator with no settings reads none."""
        return cls()

    @abstractmethod
    def __call__(self, rows: AdvantageInputs) -> tuple[Tensor, Tensor | None]: ...
