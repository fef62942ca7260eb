"""RL math for multi-turn agents: advantages (GRPO, GiGPO, GAE) and losses (PPO, GSPO, value, KL, entropy).

Pure tensor functions, no I/O; each docstring states its equation and the verl-agent / ROLL convention it
follows, and where the two differ. Ids from `RolloutBatch` are lists of strings: map them with `ids_to_index`
and `anchor_ids` first.

One algorithm, one file: `grpo.py`, `gigpo.py`, `ppo_gae.py` (each an `estimator.Estimator` that declares what
it needs), and the policy terms in `policy_loss.py` (`PPO`, `GSPO`). `ESTIMATORS`, `POLICY_LOSSES`,
`AGGREGATIONS` and `KL_ESTIMATORS` map the config's names to them.
"""

from roll_lightning.algorithms.aggregation import (
    AGG_MODES,
    AGGREGATIONS,
    AggMode,
    Aggregation,
    aggregate,
    aggregation_named,
    masked_mean,
)
from roll_lightning.algorithms.estimator import AdvantageInputs, Estimator
from roll_lightning.algorithms.gigpo import GiGPO, discounted_step_returns, gigpo_advantages
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index, segment_ids
from roll_lightning.algorithms.grpo import GRPO, grpo_advantages
from roll_lightning.algorithms.losses import (
    KL_ESTIMATORS,
    KLKind,
    entropy_from_logits,
    gspo_policy_loss,
    kl_estimator,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)
from roll_lightning.algorithms.policy_loss import GSPO, POLICY_LOSSES, PPO, PolicyLoss
from roll_lightning.algorithms.ppo_gae import PPOGAE, gae_advantages

ESTIMATORS: dict[str, type[GRPO] | type[GiGPO] | type[PPOGAE]] = {e.name: e for e in (GRPO, GiGPO, PPOGAE)}

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
    "AggMode",
    "Aggregation",
    "KLKind",
    "aggregate",
    "aggregation_named",
    "anchor_ids",
    "discounted_step_returns",
    "entropy_from_logits",
    "gae_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "gspo_policy_loss",
    "ids_to_index",
    "kl_estimator",
    "kl_penalty",
    "masked_mean",
    "ppo_policy_loss",
    "segment_ids",
    "value_loss",
]
