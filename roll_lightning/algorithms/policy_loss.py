"""The policy term P of the objective, chosen once from ``model.algorithm.loss``: `PPO` (a ratio per token) or
`GSPO` (a ratio per sequence). Formulas: `losses.ppo_token_losses` and `losses.gspo_token_losses`
(docs/algorithms.md §4, §5).

Each is a frozen dataclass whose field defaults are its default clip range (PPO 0.2 / 0.2, GSPO 3e-4 / 4e-4),
and which says how its token losses become ``P = N / D`` (`objective.Objective`): PPO aggregates them under the
run's aggregation; GSPO takes the mean over sequences of each sequence's mean, whatever the aggregation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from roll_lightning.algorithms import losses
from roll_lightning.algorithms.aggregation import Aggregation


class PolicyLoss(ABC):
    """The policy term: token losses ``[B, L]`` (0 off the mask), their numerator and the mini-batch's divisor."""

    name: ClassVar[str]
    has_dual_clip: ClassVar[bool] = False
    clip_low: float
    clip_high: float

    @abstractmethod
    def token_losses(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """``(l_t, metrics)``: the loss of every token on ``mask`` and the term's metrics but ``pg_loss``."""

    @abstractmethod
    def numerator(self, token_losses: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
        """``N``: what these rows add to the term (it sums over micro-batches)."""

    @abstractmethod
    def divisor(self, mask: Tensor, aggregation: Aggregation, norm_len: int) -> float:
        """``D``: fixed by the whole mini-batch's mask before any micro-batch runs."""


@dataclass(frozen=True)
class PPO(PolicyLoss):
    """``loss: ppo``: the clipped surrogate per token (with Clip-Higher and an optional dual clip)."""

    name: ClassVar[str] = "ppo"
    has_dual_clip: ClassVar[bool] = True

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None

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
    """``loss: gspo``: one length-normalised ratio per sequence (a row's reply tokens), a mean over sequences."""

    name: ClassVar[str] = "gspo"

    clip_low: float = 3e-4
    clip_high: float = 4e-4

    def token_losses(
        self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        scaled, _, metrics = losses.gspo_token_losses(
            logp, old_logp, advantages, mask, clip_low=self.clip_low, clip_high=self.clip_high
        )
        return scaled, metrics  # l_t / |y_j|: their sum is the sum of the sequences' means

    def numerator(self, token_losses: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
        return token_losses.sum()

    def divisor(self, mask: Tensor, aggregation: Aggregation, norm_len: int) -> float:
        return float((mask.bool().sum(-1) > 0).sum().clamp(min=1))  # the sequences: rows with a reply token


POLICY_LOSSES: dict[str, type[PPO] | type[GSPO]] = {PPO.name: PPO, GSPO.name: GSPO}
