"""Reducing a token-level loss matrix ``[B, L]`` to a scalar (verl's ``loss_agg_mode``, algorithms.md §4)."""

from __future__ import annotations

from typing import Literal, get_args

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


def aggregate(loss_mat: Tensor, mask: Tensor, mode: AggMode = "token-mean", *, norm_len: int | None = None) -> Tensor:
    """Aggregate ``l[b, t]`` over the masked tokens (``m`` = mask, rows ``b`` with ``sum_t m > 0`` are "sequences"):

    - ``token-mean``:              ``sum_bt l m / sum_bt m``  (every token weighs the same; verl default)
    - ``seq-mean-token-sum``:      ``mean_b sum_t l m``
    - ``seq-mean-token-mean``:     ``mean_b (sum_t l m / sum_t m)``  (every row weighs the same; ROLL default)
    - ``seq-mean-token-sum-norm``: ``sum_bt l m / norm_len``  (Dr.GRPO; ``norm_len`` defaults to ``L``)

    Rows with no mask token are left out of the ``seq-mean`` denominators (as current verl does), so padding
    rows do not dilute the loss. ``seq-mean-token-sum-norm`` follows verl literally: it is *not* divided by B,
    and ``L`` here is the padded width of the whole row (prompt included); Dr.GRPO wants a constant, so pass
    ``norm_len`` (e.g. the generation budget). Everything is 0 when the mask is empty.

    Always ``numerator(l, m, mode) / denominator(m, mode, norm_len)``: the numerator is a sum over rows, the
    denominator depends only on the mask, so a batch split into row groups (micro-batches) gets the same value
    (and gradient) from ``sum_k numerator(l_k, m_k) / denominator(m)`` (see `algorithms.objective`).
    """
    width = norm_len if norm_len is not None else loss_mat.shape[-1]
    return numerator(loss_mat, mask, mode) / denominator(mask, mode, width)


def numerator(loss_mat: Tensor, mask: Tensor, mode: AggMode) -> Tensor:
    """The row-additive part of `aggregate`: ``sum_bt l m``, or ``sum_b (sum_t l m / sum_t m)`` for
    ``seq-mean-token-mean``."""
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    m = mask.bool()
    losses = torch.where(m, loss_mat, 0)  # not `loss_mat * m`: inf * 0 = NaN off the mask
    if mode == "seq-mean-token-mean":
        return (losses.sum(-1) / m.sum(-1).clamp(min=1)).sum()
    return losses.sum()


def denominator(mask: Tensor, mode: AggMode, norm_len: int) -> float:
    """What `aggregate` divides by, from the mask alone: its tokens (``token-mean``), its rows with at least one
    token (``seq-mean-*``, at least 1) or the constant ``norm_len`` (``seq-mean-token-sum-norm``)."""
    m = mask.bool()
    if mode == "token-mean":
        return float(m.sum().clamp(min=1))
    if mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        return float((m.sum(-1) > 0).sum().clamp(min=1))
    if mode == "seq-mean-token-sum-norm":
        return float(norm_len)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
