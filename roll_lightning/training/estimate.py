"""A `RolloutBatch` into `AdvantageInputs`, and `check_rows`, the one check of an estimator's needs."""

from __future__ import annotations

import torch

from roll_lightning.algorithms import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.rollout.episodes.layout import Layout
from roll_lightning.training.config import TrainingConfigError


def check_rows(estimator: Estimator, layout: Layout, group_size: int | None = None) -> None:
    """Raise `TrainingConfigError`, naming the key, if these rows cannot feed ``estimator``."""
    key = f"model.algorithm.estimator={estimator.name}"
    if estimator.needs_groups and group_size is not None and group_size < 2:
        raise TrainingConfigError(
            f"data.rollout.group_size={group_size}: the '{estimator.name}' estimator normalises within groups and "
            "needs group_size >= 2"
        )
    if estimator.needs_step_rows and not layout.one_row_per_turn:
        raise TrainingConfigError(f"{key} needs step rows: set data.rollout.episode.layout: step")


def estimate_advantages(
    batch: RolloutBatch, estimator: Estimator, values: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(advantages, returns)``; ``values`` are the critic's (GAE only)."""
    check_rows(estimator, batch.layout)
    device = batch.input_ids.device
    rows = AdvantageInputs(
        episode_scores=batch.episode_scores,
        step_scores=batch.step_scores,
        token_scores=batch.scores,
        response_mask=batch.response_mask,
        group_ids=ids_to_index(batch.traj_group_id).to(device),
        traj_ids=ids_to_index(batch.traj_id).to(device),
        step_index=batch.step,
        anchors=anchor_ids(batch.anchor).to(device) if estimator.needs_step_rows else None,
        values=values,
    )
    return estimator(rows)
