"""The loss of one mini-batch, ``L = P + c_kl K - c_H H + c_V V`` (docs/algorithms.md §7).

Each term is ``N / D``: ``N`` sums over rows and ``D`` is fixed by the whole mini-batch's mask, so micro-batches'
``N_k / D`` add up exactly, however the rows are split.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from roll_lightning.algorithms import losses
from roll_lightning.algorithms.aggregation import TOKEN_MEAN, Aggregation
from roll_lightning.algorithms.policy_loss import PPO, PolicyLoss

# parts of the loss add up over micro-batches; other metrics are token-weighted means
ADDITIVE = frozenset({"loss", "pg_loss", "kl", "entropy", "value_loss"})


@dataclass(frozen=True)
class Divisors:
    """Each term's denominator, from the whole mini-batch's mask."""

    policy: float  # over the policy mask
    regularizer: float  # KL and entropy
    value: float  # critic: token-mean


@dataclass(frozen=True)
class MicroInputs:
    """One micro-batch's rows, ``[b, l]`` (``l`` may be its own width)."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor  # [b] or [b, l]
    mask: Tensor
    entropy: Tensor | None = None
    ref_logp: Tensor | None = None
    values: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    is_weights: Tensor | None = None  # `algorithms.correction`
    policy_mask: Tensor | None = None  # None: ``mask``


@dataclass(frozen=True)
class Objective:
    """The loss's settings (`AlgorithmConfig.objective`); ``norm_len`` None: the padded width."""

    policy: PolicyLoss = field(default_factory=PPO)
    aggregation: Aggregation = TOKEN_MEAN
    norm_len: int | None = None
    kl_coef: float = 0.0
    kl: losses.KLEstimator = losses.kl_k3
    entropy_coef: float = 0.0
    value_coef: float = 0.0
    value_clip: float | None = 0.2

    def divisors(self, mask: Tensor, policy_mask: Tensor | None = None) -> Divisors:
        """A mini-batch's denominators."""
        norm_len = self.norm_len if self.norm_len is not None else mask.shape[-1]
        pmask = mask if policy_mask is None else policy_mask
        return Divisors(
            policy=self.policy.divisor(pmask, self.aggregation, norm_len),
            regularizer=self.aggregation.denominator(mask, norm_len),
            value=TOKEN_MEAN.denominator(mask, norm_len),
        )

    def __call__(self, x: MicroInputs, d: Divisors) -> tuple[Tensor, dict[str, Tensor]]:
        """This micro-batch's share of ``L``, and its metrics."""
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
    """``L`` of a batch taken whole."""
    return objective(x, objective.divisors(x.mask))[0]
