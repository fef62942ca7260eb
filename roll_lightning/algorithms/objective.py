"""The training objective of one mini-batch, exact however its rows are split into micro-batches.

    L = P + c_kl K - c_H H + c_V V

    P  policy term:  PPO  aggregate(l^PPO, m, agg)              (`losses.ppo_token_losses`)
                     GSPO mean_j (1/|y_j|) sum_{t in j} l^GSPO_t  (`losses.gspo_token_losses`)
    K  KL to the reference:  aggregate(kl_t, m, agg)            (`losses.kl_estimator`)
    H  entropy bonus:        aggregate(H_t, m, agg)             (`losses.entropy_from_logits`)
    V  critic (ppo-gae):     aggregate(0.5 max((v-R)^2, (v_clip-R)^2), m, token-mean)   (`losses.value_token_losses`)

With an off-policy correction (`algorithms.correction`) the policy token losses are weighted, ``w_t l_t``, and
tokens a mask dropped leave P's numerator and denominator.

Every term is ``N / D``: a numerator that adds up over rows (`aggregation.Aggregation.numerator`: sums of token losses,
or of per-row means) and a denominator fixed by the *whole* mini-batch's mask (`Divisors`: its tokens, its
rows, its sequences, or a constant). A micro-batch adds ``N_k / D`` for each term, so the sum over micro-batches
is the mini-batch's loss and gradient exactly, whatever the split (1 row or all of them, padded to the batch or
to the micro-batch's own longest row).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from roll_lightning.algorithms import losses
from roll_lightning.algorithms.aggregation import TOKEN_MEAN, Aggregation
from roll_lightning.algorithms.policy_loss import PPO, PolicyLoss

# Metrics that are parts of the loss: a micro-batch's value is its contribution, so they add up (the others are
# means or extrema over the micro-batch's tokens, averaged over micro-batches weighted by their tokens).
ADDITIVE = frozenset({"loss", "pg_loss", "kl", "entropy", "value_loss"})


@dataclass(frozen=True)
class Divisors:
    """Each term's denominator, from the whole mini-batch's response mask (before any micro-batch runs)."""

    policy: float  # PPO: aggregate's denominator; GSPO: the number of sequences (rows with a reply token); both
    # over the policy term's tokens (the reply tokens, minus those an off-policy mask dropped)
    regularizer: float  # KL and entropy: aggregate's denominator under the run's aggregation
    value: float  # critic: the number of reply tokens (token-mean)


@dataclass(frozen=True)
class MicroInputs:
    """One micro-batch's rows, token-aligned ``[b, l]`` (``l`` may be the micro-batch's own width)."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor  # [b] or [b, l]
    mask: Tensor
    entropy: Tensor | None = None
    ref_logp: Tensor | None = None
    values: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    is_weights: Tensor | None = None  # off-policy importance weights of the policy term (`algorithms.correction`)
    policy_mask: Tensor | None = None  # the policy term's tokens (None: ``mask``)


@dataclass(frozen=True)
class Objective:
    """The loss's settings, chosen once (from `training.config.AlgorithmConfig.objective`).

    ``policy``: the policy term P with its clip range (`policy_loss.PPO` or `policy_loss.GSPO`).
    ``aggregation``: how P (PPO), K and H become ``N / D`` (`aggregation.TokenMean` and its siblings).
    ``kl``: the per-token estimator of K (`losses.KL_ESTIMATORS`; k3 by default).
    ``norm_len``: the constant of ``seq-mean-token-sum-norm`` (None: the padded width of the batch the
    divisors are taken from, the same for all its micro-batches).
    """

    policy: PolicyLoss = field(default_factory=PPO)
    aggregation: Aggregation = TOKEN_MEAN
    norm_len: int | None = None
    kl_coef: float = 0.0
    kl: losses.KLEstimator = losses.kl_k3
    entropy_coef: float = 0.0
    value_coef: float = 0.0
    value_clip: float | None = 0.2

    def divisors(self, mask: Tensor, policy_mask: Tensor | None = None) -> Divisors:
        """The denominators of a mini-batch with response mask ``mask`` (``[B, L]``, the batch's width) and, when
        an off-policy mask dropped tokens, ``policy_mask`` (what is left of the policy term)."""
        norm_len = self.norm_len if self.norm_len is not None else mask.shape[-1]
        pmask = mask if policy_mask is None else policy_mask
        return Divisors(
            policy=self.policy.divisor(pmask, self.aggregation, norm_len),
            regularizer=self.aggregation.denominator(mask, norm_len),
            value=TOKEN_MEAN.denominator(mask, norm_len),
        )

    def __call__(self, x: MicroInputs, d: Divisors) -> tuple[Tensor, dict[str, Tensor]]:
        """This micro-batch's share of ``L`` (sum them over the mini-batch's micro-batches) and its metrics."""
        pmask = x.mask if x.policy_mask is None else x.policy_mask
        token_losses, metrics = self.policy.token_losses(x.logp, x.old_logp, x.advantages, pmask)
        if x.is_weights is not None:
            token_losses = token_losses * x.is_weights
        policy = self.policy.numerator(token_losses, pmask, self.aggregation) / d.policy
        out = dict(metrics)
        out["pg_loss"] = policy.detach()
        total = policy
        if self.entropy_coef > 0 and x.entropy is not None:
            entropy = self.aggregation.numerator(x.entropy, x.mask) / d.regularizer
            total = total - self.entropy_coef * entropy
            out["entropy"] = entropy.detach()
        if self.kl_coef > 0 and x.ref_logp is not None:
            kl = self.aggregation.numerator(self.kl(x.logp, x.ref_logp), x.mask)
            kl = kl / d.regularizer
            total = total + self.kl_coef * kl
            out["kl"] = kl.detach()
        if x.values is not None and x.old_values is not None and x.returns is not None:
            value_losses, value_metrics = losses.value_token_losses(
                x.values, x.old_values, x.returns, x.mask, clip=self.value_clip
            )
            value = value_losses.sum() / d.value
            total = total + self.value_coef * value
            out.update(value_metrics)
            out["value_loss"] = value.detach()
        out["loss"] = total.detach()
        return total, out


def whole(objective: Objective, x: MicroInputs) -> Tensor:
    """``L`` of a batch taken whole (one micro-batch): the reference the micro-batch sums must equal."""
    return objective(x, objective.divisors(x.mask))[0]
