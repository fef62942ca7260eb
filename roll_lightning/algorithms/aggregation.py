"""Token losses ``[B, L]`` to a scalar (verl's ``loss_agg_mode``, docs/algorithms.md §4)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x m) / max(sum(m), 1)``; NaN/inf off the mask never enter."""
    m = mask.bool()
    total = torch.where(m, x, 0).sum() if dim is None else torch.where(m, x, 0).sum(dim)
    count = m.sum() if dim is None else m.sum(dim)
    return total / count.clamp(min=1)


def _masked(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), loss_mat, 0)  # not `loss_mat * m`: inf * 0 = NaN off the mask


def _sequences(mask: Tensor) -> float:
    return float((mask.bool().sum(-1) > 0).sum().clamp(min=1))


class Aggregation(ABC):
    """``numerator(l, m) / denominator(m)``; the numerator sums over rows, so micro-batches add up exactly."""

    name: ClassVar[AggMode]

    def numerator(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        return _masked(loss_mat, mask).sum()

    @abstractmethod
    def denominator(self, mask: Tensor, norm_len: int) -> float:
        """From the mask alone."""

    def __call__(self, loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
        width = norm_len if norm_len is not None else loss_mat.shape[-1]
        return self.numerator(loss_mat, mask) / self.denominator(mask, width)


@dataclass(frozen=True)
class TokenMean(Aggregation):
    """``sum_bt l m / sum_bt m`` (verl's default)."""

    name: ClassVar[AggMode] = "token-mean"

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return float(mask.bool().sum().clamp(min=1))


@dataclass(frozen=True)
class SeqMeanTokenSum(Aggregation):
    """``mean_b sum_t l m``."""

    name: ClassVar[AggMode] = "seq-mean-token-sum"

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return _sequences(mask)


@dataclass(frozen=True)
class SeqMeanTokenMean(Aggregation):
    """``mean_b (sum_t l m / sum_t m)`` (ROLL's default)."""

    name: ClassVar[AggMode] = "seq-mean-token-mean"

    def numerator(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        return (_masked(loss_mat, mask).sum(-1) / mask.bool().sum(-1).clamp(min=1)).sum()

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return _sequences(mask)


@dataclass(frozen=True)
class SeqMeanTokenSumNorm(Aggregation):
    """``sum_bt l m / norm_len`` (Dr.GRPO; as verl, not divided by B)."""

    name: ClassVar[AggMode] = "seq-mean-token-sum-norm"

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return float(norm_len)


AGGREGATIONS: dict[str, Aggregation] = {
    a.name: a for a in (TokenMean(), SeqMeanTokenSum(), SeqMeanTokenMean(), SeqMeanTokenSumNorm())
}
TOKEN_MEAN = AGGREGATIONS["token-mean"]


def aggregation_named(mode: str) -> Aggregation:
    try:
        return AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}") from None


def aggregate(loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", *, norm_len: int | None = None) -> Tensor:
    """``l`` reduced by the named mode; rows with no mask token leave the denominators (as verl)."""
    return aggregation_named(mode)(loss_mat, mask, norm_len)
