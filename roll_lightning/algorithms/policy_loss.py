"""The policy term P (``model.algorithm.loss``): `PPO` or `GSPO`, formulas in `losses`; defaults are their clips."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor

from roll_lightning.algorithms import losses
from roll_lightning.algorithms.aggregation import Aggregation
from roll_lightning.algorithms.grouping import segment_ids


class PolicyLoss(ABC):
    """Token losses ``[B, L]``, and how they become ``P = N / D``."""

    name: ClassVar[str]
    has_dual_clip: ClassVar[bool] = False
    clip_low: float
    clip_high: float

    @classmethod
    @abstractmethod
    def from_settings(cls, settings: Any) -> PolicyLoss:
        """Built from ``model.algorithm``, reading the keys it uses; an unset clip is the loss's own default."""

    @abstractmethod
    def token_losses(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(l_t, metrics)``, 0 off ``mask``."""

    @abstractmethod
    def numerator(self, token_losses: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
        """``N``: what these rows add."""

    @abstractmethod
    def divisor(self, mask: Tensor, aggregation: Aggregation, norm_len: int) -> float:
        """``D``: from the whole mini-batch's mask."""


@dataclass(frozen=True)
class PPO(PolicyLoss):
    """``loss: ppo``: aggregated under the run's aggregation."""

    name: ClassVar[str] = "ppo"
    has_dual_clip: ClassVar[bool] = True

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> PPO:
        return cls(
            clip_low=_or(settings.clip_low, cls.clip_low),
            clip_high=_or(settings.clip_high, cls.clip_high),
            dual_clip=settings.dual_clip,
        )

    def token_losses(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return losses.ppo_token_losses(
            logp, old_logp, advantages, mask, clip_low=self.clip_low, clip_high=self.clip_high,
            dual_clip=self.dual_clip,
        )  # fmt: skip

    def numerator(self, token_losses: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
        return aggregation.numerator(token_losses, mask)

    def divisor(self, mask: Tensor, aggregation: Aggregation, norm_len: int) -> float:
        return aggregation.denominator(mask, norm_len)


@dataclass(frozen=True)
class GSPO(PolicyLoss):
    """``loss: gspo``: a mean of sequence means. A sequence is a row's reply tokens, or with ``per_turn`` each run
    of them, one turn of a trajectory row (ROLL's ``ratio_type: segment``)."""

    name: ClassVar[str] = "gspo"

    clip_low: float = 3e-4
    clip_high: float = 4e-4
    per_turn: bool = False

    @classmethod
    def from_settings(cls, settings: Any) -> GSPO:
        return cls(
            clip_low=_or(settings.clip_low, cls.clip_low),
            clip_high=_or(settings.clip_high, cls.clip_high),
            per_turn=settings.gspo_per_turn,
        )

    def token_losses(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        scaled, _, metrics = losses.gspo_token_losses(
            logp, old_logp, advantages, mask, clip_low=self.clip_low, clip_high=self.clip_high,
            seq_ids=segment_ids(mask) if self.per_turn else None,
        )  # fmt: skip
        return scaled, metrics  # l_t / |y_j|

    def numerator(self, token_losses: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
        return token_losses.sum()

    def divisor(self, mask: Tensor, aggregation: Aggregation, norm_len: int) -> float:
        if self.per_turn:
            return float(segment_ids(mask).amax(-1).sum().clamp(min=1))  # runs of reply tokens
        return float((mask.bool().sum(-1) > 0).sum().clamp(min=1))  # rows with a reply token


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


POLICY_LOSSES: dict[str, type[PolicyLoss]] = {loss.name: loss for loss in (PPO, GSPO)}
