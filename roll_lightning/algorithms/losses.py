"""Policy/value losses, KL estimators and entropy on token-aligned ``[B, L]`` tensors (docs/algorithms.md §4-5).

Positions off ``response_mask`` never reach a loss or its gradient, even as NaN/inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from roll_lightning.algorithms.aggregation import AggMode, aggregate, masked_mean
from roll_lightning.algorithms.grouping import dense_index

MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps the ratio finite, as verl


def _broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    return advantages.unsqueeze(-1) if advantages.dim() == like.dim() - 1 else advantages


def _masked_extrema(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    if not bool(mask.any()):
        return x.new_zeros(()), x.new_zeros(())
    return x[mask].max(), x[mask].min()


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: AggMode = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`ppo_token_losses` aggregated over a whole batch."""
    losses, metrics = ppo_token_losses(
        logp, old_logp, advantages, response_mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    loss = aggregate(losses, response_mask, agg, norm_len=norm_len)
    return loss, {"pg_loss": loss.detach(), **metrics}


def ppo_token_losses(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017), Clip-Higher (DAPO), dual clip (Ye et al. 2019), ``[B, L]``:

        r_t = exp(clamp(logp_t - old_logp_t, -20, 20))
        l_t = max(-A_t*r_t, -A_t*clip(r_t, 1-clip_low, 1+clip_high))
        l_t = min(l_t, -A_t*c)   if A_t < 0 and dual_clip = c > 1

    ``ppo_kl`` is k1 of KL(old || new), as verl.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    mask = response_mask.bool()
    adv = torch.where(mask, _broadcast_advantages(advantages, logp), 0)
    log_ratio = torch.where(mask, logp - old_logp, 0).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if dual_clip is not None:
        cap = -adv * dual_clip
        dual_active = (adv < 0) & (losses > cap)
        losses = torch.where(adv < 0, torch.minimum(losses, cap), losses)
    losses = torch.where(mask, losses, 0)
    with torch.no_grad():
        ratio_max, ratio_min = _masked_extrema(ratio, mask)
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "pg_clipfrac_lower": masked_mean(dual_active.float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": ratio_max,
            "ratio_min": ratio_min,
        }
    return losses, metrics


def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    seq_ids: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`gspo_token_losses` over a whole batch."""
    losses, sequences, metrics = gspo_token_losses(
        logp, old_logp, advantages, response_mask, clip_low=clip_low, clip_high=clip_high, seq_ids=seq_ids
    )
    loss = losses.sum() / max(sequences, 1)
    return loss, {"pg_loss": loss.detach(), **metrics}


def gspo_token_losses(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    seq_ids: Tensor | None = None,
) -> tuple[Tensor, int, dict[str, Tensor]]:
    """GSPO-token (Zheng et al. 2025, arXiv 2507.18071, Eqs. 10-11):

        s_j     = exp(min(mean_{t in j}(logp_t - old_logp_t), 10))
        s_{j,t} = sg[s_j] * exp(logp_t - sg[logp_t])      (= s_j in value)
        l_t     = max(-A_t*s_{j,t}, -A_t*clip(s_{j,t}, 1-clip_low, 1+clip_high))
        loss    = mean_j mean_{t in j} l_t

    A sequence j is a row's reply tokens, or a ``seq_ids`` run (``segment_ids``: per turn). Returns
    ``(l_t / |y_j|, #sequences, metrics)``.
    """
    mask = response_mask.bool()
    rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(-1).expand_as(mask)
    keys = (rows[mask],) if seq_ids is None else (rows[mask], seq_ids[mask])
    seq_of_token, num_seqs = dense_index(*keys) if bool(mask.any()) else (rows[mask], 0)
    seq = torch.zeros_like(rows)
    seq[mask] = seq_of_token  # 0 off the mask, read only through a masked `where`

    lp = torch.where(mask, logp, 0)
    log_ratio = torch.where(mask, logp - old_logp, 0).detach()
    per_seq_zeros = lp.new_zeros(max(num_seqs, 1))  # `seq` indexes slot 0 even with an empty mask
    seq_len = per_seq_zeros.index_add(0, seq_of_token, torch.ones_like(log_ratio[mask])).clamp(min=1)
    seq_log_ratio = per_seq_zeros.index_add(0, seq_of_token, log_ratio[mask]) / seq_len
    # value log s_j, gradient d logp_t
    log_s = (lp - lp.detach() + seq_log_ratio[seq]).clamp(max=10.0)
    s = torch.exp(log_s)
    adv = torch.where(mask, _broadcast_advantages(advantages, logp), 0)
    unclipped = -adv * s
    clipped = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    losses = torch.where(mask, torch.maximum(unclipped, clipped), 0)
    scaled = torch.where(mask, losses / seq_len[seq], 0)  # summed: the sum of sequence means
    with torch.no_grad():
        seq_ratio = torch.exp(seq_log_ratio.clamp(max=10.0))
        has_seq = torch.arange(seq_ratio.numel(), device=seq_ratio.device) < num_seqs
        ratio_max, ratio_min = _masked_extrema(seq_ratio, has_seq)
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
            "ratio_mean": masked_mean(seq_ratio, has_seq),
            "ratio_max": ratio_max,
            "ratio_min": ratio_min,
        }
    return scaled, num_seqs, metrics


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1: ``logp - ref_logp`` (unbiased, high variance)."""
    return logp - ref_logp


def kl_abs(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``|logp - ref_logp|``."""
    return (logp - ref_logp).abs()


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2: ``0.5 (logp - ref_logp)^2``."""
    return 0.5 * (logp - ref_logp).square()


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3: ``exp(ref-logp) - (ref-logp) - 1`` (unbiased, >= 0), clamped as verl."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(-10.0, 10.0)


KLEstimator = Callable[[Tensor, Tensor], Tensor]
KL_ESTIMATORS: dict[str, KLEstimator] = {
    "k1": kl_k1, "kl": kl_k1, "abs": kl_abs, "k2": kl_k2, "mse": kl_k2, "k3": kl_k3, "low_var_kl": kl_k3,
}  # fmt: skip
KLKind = Literal[tuple(KL_ESTIMATORS)]  # type: ignore[valid-type]  # the registry's names: a new estimator is one entry


def kl_estimator(kind: str) -> KLEstimator:
    """The unmasked per-token KL(pi || ref) estimator called ``kind`` (Schulman, "Approximating KL")."""
    try:
        return KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown KL kind {kind!r}; expected one of {tuple(KL_ESTIMATORS)}") from None


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: KLKind = "low_var_kl") -> Tensor:
    return kl_estimator(kind)(logp, ref_logp)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """``H = -sum_v p_v log p_v``; ``-inf`` logits add 0, not NaN."""
    logp = torch.log_softmax(logits, dim=-1)
    finite_logp = torch.where(torch.isfinite(logp), logp, 0)  # 0 * log 0 := 0
    return -(logp.exp() * finite_logp).sum(-1)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: AggMode = "token-mean",
    norm_len: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`value_token_losses` aggregated over a whole batch."""
    losses, metrics = value_token_losses(values, old_values, returns, response_mask, clip=clip)
    loss = aggregate(losses, response_mask, agg, norm_len=norm_len)
    return loss, {"vf_loss": loss.detach(), **metrics}


def value_token_losses(
    values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor, *, clip: float | None = 0.2
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss (PPO2), ``[B, L]``: ``0.5*max((v-R)^2, (v_clip-R)^2)``, ``v_clip = old+clip(v-old, -c, c)``;
    the 0.5 is ROLL's."""
    mask = response_mask.bool()
    v = torch.where(mask, values, 0)
    target = torch.where(mask, returns, 0)
    losses = (v - target).square()
    clipped_more = torch.zeros_like(mask)
    if clip is not None:
        old = torch.where(mask, old_values, 0)
        v_clipped = old + (v - old).clamp(-clip, clip)
        clipped_losses = (v_clipped - target).square()
        clipped_more = clipped_losses > losses
        losses = torch.maximum(losses, clipped_losses)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean(clipped_more.float(), mask),
            "vpred_mean": masked_mean(values.detach(), mask),
        }
    return torch.where(mask, 0.5 * losses, 0), metrics
