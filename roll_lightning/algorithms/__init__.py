"""RL math for multi-turn agents: advantages (GRPO, GiGPO, GAE) and losses (PPO, GSPO, value, KL, entropy).

Pure tensor functions, one algorithm per file (docs/algorithms.md). The whole-loss helpers the tests check
formulas with (`losses.ppo_policy_loss`, `gspo_policy_loss`, `kl_penalty`, `aggregation.aggregate`) stay in
their modules: the trainer builds its loss as an `Objective`.
"""

from roll_lightning.algorithms.aggregation import AGG_MODES, AGGREGATIONS, AggMode, Aggregation, masked_mean
from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.gigpo import GiGPO, discounted_step_returns, gigpo_advantages
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index, segment_ids
from roll_lightning.algorithms.grpo import GRPO, grpo_advantages
from roll_lightning.algorithms.losses import KL_ESTIMATORS, KLKind, entropy_from_logits, value_loss
from roll_lightning.algorithms.policy_loss import GSPO, POLICY_LOSSES, PPO, PolicyLoss
from roll_lightning.algorithms.ppo_gae import PPOGAE, gae_advantages
from roll_lightning.algorithms.vine import Vine, vine_advantages

ESTIMATORS: dict[str, type[Estimator]] = {e.name: e for e in (GRPO, GiGPO, PPOGAE, Vine)}

__all__ = [
    "AGG_MODES",
    "AGGREGATIONS",
    "ESTIMATORS",
    "GRPO",
    "GSPO",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PPO",
    "PPOGAE",
    "AdvantageInputs",
    "Estimator",
    "GiGPO",
    "PolicyLoss",
    "Vine",
    "AggMode",
    "Aggregation",
    "KLKind",
    "anchor_ids",
    "discounted_step_returns",
    "entropy_from_logits",
    "gae_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "ids_to_index",
    "masked_mean",
    "segment_ids",
    "value_loss",
    "vine_advantages",
]
