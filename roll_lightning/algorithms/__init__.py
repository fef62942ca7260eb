"""RL math for multi-turn agents: advantages (GRPO, GiGPO, GAE) and losses (PPO, GSPO, value, KL, entropy).

Pure tensor functions, no I/O; each docstring states its equation and the verl-agent / ROLL convention it
follows, and where the two differ. Ids from `RolloutBatch` are lists of strings: map them with `ids_to_index`
and `anchor_ids` first.
"""

from roll_lightning.algorithms.advantages import (
    discounted_step_returns,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    whiten,
)
from roll_lightning.algorithms.aggregation import AGG_MODES, AggMode, aggregate, masked_mean
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index, segment_ids
from roll_lightning.algorithms.losses import (
    KLKind,
    entropy_from_logits,
    gspo_policy_loss,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)

__all__ = [
    "AGG_MODES",
    "AggMode",
    "KLKind",
    "aggregate",
    "anchor_ids",
    "discounted_step_returns",
    "entropy_from_logits",
    "gae_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "gspo_policy_loss",
    "ids_to_index",
    "kl_penalty",
    "masked_mean",
    "ppo_policy_loss",
    "segment_ids",
    "value_loss",
    "whiten",
]
