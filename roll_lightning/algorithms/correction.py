"""Off-policy correction: importance weights for the sampler/trainer gap (docs/algorithms.md §8).

    log rho_t = old_logp_t - mu_t                  mu: the sampler's log-probs
    token:      log w_t = log rho_t
    sequence:   log w_t = sum_{s in j(t)} log rho_s
    geometric:  log w_t = mean_{s in j(t)} log rho_s
    w_t = exp(clamp(log w_t, -20, 20))
    truncate (TIS, Yao et al. 2025):  w_t <- min(w_t, C)
    mask (MIS, Liu et al. 2025):      tokens with w_t outside [1/C, C] leave the policy term

``j(t)``: the token's turn or row (``span``). The weights are constants on the policy token losses only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from roll_lightning.algorithms.aggregation import masked_mean
from roll_lightning.algorithms.grouping import segment_ids

Mode = Literal["none", "truncate", "mask"]
Level = Literal["token", "sequence", "geometric"]
Span = Literal["turn", "trajectory"]
MAX_LOG_WEIGHT = 20.0


@dataclass(frozen=True)
class Correction:
    """``weights`` ``[B, L]`` (1 off the mask) and ``mask``: the reply tokens MIS kept."""

    weights: Tensor
    mask: Tensor
    metrics: dict[str, Tensor]


def importance_weights(
    old_logp: Tensor,
    behaviour_logp: Tensor,
    response_mask: Tensor,
    *,
    mode: Mode = "truncate",
    level: Level = "token",
    span: Span = "turn",
    cap: float = 2.0,
) -> Correction:
    """The module's weights; metrics are before truncation or masking."""
    if cap <= 1.0:
        raise ValueError(f"cap must be > 1, got {cap}")
    mask = response_mask.bool()
    log_rho = torch.where(mask, old_logp - behaviour_logp, 0).float()
    if level == "token":
        log_w = log_rho
    else:
        seq = segment_ids(mask) if span == "turn" else mask.long()  # ids > 0 on reply tokens, 0 elsewhere
        rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(-1).expand_as(mask)
        key = rows * (int(seq.max()) + 1) + seq  # one id per (row, sequence); padding is never read back
        flat = torch.zeros(key.numel(), dtype=log_rho.dtype, device=mask.device)
        total = flat.index_add(0, key.flatten(), log_rho.flatten())
        count = torch.zeros_like(flat).index_add(0, key.flatten(), mask.flatten().to(flat.dtype))
        per_seq = total if level == "sequence" else total / count.clamp(min=1)
        log_w = torch.where(mask, per_seq[key], 0)
    raw = torch.exp(log_w.clamp(-MAX_LOG_WEIGHT, MAX_LOG_WEIGHT))
    kept = mask.clone()
    truncated = torch.zeros_like(mask)
    weights = raw
    if mode == "truncate":
        truncated = mask & (raw > cap)
        weights = raw.clamp(max=cap)
    elif mode == "mask":
        kept = mask & (raw >= 1.0 / cap) & (raw <= cap)
    elif mode == "none":  # measured (the metrics), not applied
        weights = torch.ones_like(raw)
    else:
        raise ValueError(f"unknown correction mode {mode!r}")
    weights = torch.where(kept, weights, 1.0)
    with torch.no_grad():
        metrics = {
            "is_weight_mean": masked_mean(raw, mask),
            "is_weight_max": raw[mask].max() if bool(mask.any()) else raw.new_ones(()),
            "is_truncated_frac": masked_mean(truncated.float(), mask),
            "is_masked_frac": masked_mean((mask & ~kept).float(), mask),
        }
    return Correction(weights.detach(), kept, metrics)
