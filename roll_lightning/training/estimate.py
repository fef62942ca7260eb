"""`estimate_advantages`: a rollout batch's rows → the configured estimator's advantages (and GAE's returns).

The estimators themselves are pure tensor functions in `roll_lightning.algorithms.advantages`; this module only
maps a `RolloutBatch` onto their arguments: group and trajectory ids become indices, GiGPO's anchor
observations become state ids, and only PPO-GAE uses the critic's values.
"""

from __future__ import annotations

import torch

from roll_lightning.algorithms import advantages as adv
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index
from roll_lightning.rollout.batch import RolloutBatch
from roll_lightning.training.config import AlgorithmConfig


def estimate_advantages(
    batch: RolloutBatch, algo: AlgorithmConfig, values: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(advantages, returns)``: per row ``[B]`` (GRPO, GiGPO) or per token ``[B, L]`` (GAE, which also returns
    the value targets; ``values`` are the critic's, required then)."""
    device = batch.input_ids.device
    groups = ids_to_index(batch.traj_group_id).to(device)
    trajs = ids_to_index(batch.traj_id).to(device)
    if algo.estimator == "grpo":
        return adv.grpo_advantages(batch.episode_scores, groups, traj_ids=trajs, norm_by_std=algo.norm_by_std), None
    if algo.estimator == "gigpo":
        if batch.layout != "step":
            raise ValueError("model.algorithm.estimator=gigpo needs step rows: set data.rollout.episode.layout: step")
        advantages = adv.gigpo_advantages(
            batch.episode_scores,
            batch.step_scores,
            groups,
            trajs,
            batch.step,
            anchor_ids(batch.anchor).to(device),
            gamma=algo.gigpo_gamma,
            step_weight=algo.step_weight,
            norm_by_std=algo.norm_by_std,
        )
        return advantages, None
    if values is None:
        raise ValueError(f"model.algorithm.estimator={algo.estimator} needs the critic's values")
    return adv.gae_advantages(batch.scores, values, batch.response_mask, gamma=algo.gamma, lam=algo.lam)
