"""Reducing a token-level loss matrix ``[B, L]`` to a scalar (verl's ``loss_agg_mode``, algorithms.md §4).

Each mode is a small object (`TokenMean`, `SeqMeanTokenSum`, `SeqMeanTokenMean`, `SeqMeanTokenSumNorm`), chosen
once from its name (`aggregation_named`); `aggregate` is the same reduction for callers that hold a name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal, get_args

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = get_args(AggMode)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x m) / max(sum(m), 1)``; positions off the mask never enter (not even as NaN/inf)."""
    m = mask.bool()
    total = torch.where(m, x, 0).sum() if dim is None else torch.where(m, x, 0).sum(dim)
    count = m.sum() if dim is None else m.sum(dim)
    return total / count.clamp(min=1)


def _masked(loss_mat: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask.bool(), loss_mat, 0)  # not `loss_mat * m`: inf * 0 = NaN off the mask


def _sequences(mask: Tensor) -> float:
    """Rows with at least one mask token (at least 1)."""
    return float((mask.bool().sum(-1) > 0).sum().clamp(min=1))


class Aggregation(ABC):
    """``aggregate(l, m) = numerator(l, m) / denominator(m)``: the numerator is a sum over rows, the denominator
    depends only on the mask, so a batch split into row groups (micro-batches) gets the same value (and gradient)
    from ``sum_k numerator(l_k, m_k) / denominator(m)`` (see `algorithms.objective`)."""

    name: ClassVar[AggMode]

    def numerator(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        """The row-additive part: ``sum_bt l m`` unless the mode says otherwise."""
        return _masked(loss_mat, mask).sum()

    @abstractmethod
    def denominator(self, mask: Tensor, norm_len: int) -> float:
        """What the numerator is divided by, from the mask alone (``norm_len``: the constant of the ``-norm``
        mode, the padded width when the caller has none)."""

    def __call__(self, loss_mat: Tensor, mask: Tensor, norm_len: int | None = None) -> Tensor:
        width = norm_len if norm_len is not None else loss_mat.shape[-1]
        return self.numerator(loss_mat, mask) / self.denominator(mask, width)


@dataclass(frozen=True)
class TokenMean(Aggregation):
    """``sum_bt l m / sum_bt m``: every token weighs the same (verl's default)."""

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
    """``mean_b (sum_t l m / sum_t m)``: every row weighs the same (ROLL's default)."""

    name: ClassVar[AggMode] = "seq-mean-token-mean"

    def numerator(self, loss_mat: Tensor, mask: Tensor) -> Tensor:
        return (_masked(loss_mat, mask).sum(-1) / mask.bool().sum(-1).clamp(min=1)).sum()

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return _sequences(mask)


@dataclass(frozen=True)
class SeqMeanTokenSumNorm(Aggregation):
    """``sum_bt l m / norm_len`` (Dr.GRPO). As in verl it is *not* divided by B, and without ``norm_len`` it is
    the padded width of the whole row (prompt included); Dr.GRPO wants a constant, e.g. the generation budget."""

    name: ClassVar[AggMode] = "seq-mean-token-sum-norm"

    def denominator(self, mask: Tensor, norm_len: int) -> float:
        return float(norm_len)


AGGREGATIONS: dict[str, Aggregation] = {
    a.name: a for a in (TokenMean(), SeqMeanTokenSum(), SeqMeanTokenMean(), SeqMeanTokenSumNorm())
}
TOKEN_MEAN = AGGREGATIONS["token-mean"]


def aggregation_named(mode: str) -> Aggregation:
    """The aggregation called ``mode`` (one of `AGG_MODES`)."""
    try:
        return AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}") from None


def aggregate(loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", *, norm_len: int | None = None) -> Tensor:
    """Aggregate ``l[b, t]`` over the masked tokens (``m`` = mask, rows ``b`` with ``sum_t m > 0`` are "sequences"):

    - ``token-mean``:              ``sum_bt l m / sum_bt m``  (every token weighs the same; verl default)
    - ``seq-mean-token-sum``:      ``mean_b sum_t l m``
    - ``seq-mean-token-mean``:     ``mean_b (sum_t l m / sum_t m)``  (every row weighs the same; ROLL default)
    - ``seq-mean-token-sum-norm``: ``sum_bt l m / norm_len``  (Dr.GRPO; ``norm_len`` defaults to ``L``)

    Rows with no mask token are left out of the ``seq-mean`` denominators (as current verl does), so padding
    rows do not dilute the loss. Everything is 0 when the mask is empty.
    """
    return aggregation_named(mode)(loss_mat, mask, norm_len)
