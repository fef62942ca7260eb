"""`estimate_advantages`: a rollout batch's rows → the chosen estimator's advantages (and GAE's returns); and
`check_rows`, the one check that a rollout's rows can feed that estimator.

The estimators are small objects in `roll_lightning.algorithms` (`grpo.py`, `gigpo.py`, `ppo_gae.py`) that say
what they need; this module maps a `RolloutBatch` onto their `AdvantageInputs`: group and trajectory ids become
indices, anchor observations become state ids (only for an estimator that needs step rows) and the critic's
values come along (only for one that uses a critic).
"""

from __future__ import annotations

import torch

from roll_lightning.algorithms import AdvantageInputs, Estimator
from roll_lightning.algorithms.grouping import anchor_ids, ids_to_index
from roll_lightning.rollout.batch import RolloutBatch
from roll_lightning.rollout.layout import Layout
from roll_lightning.training.config import TrainingConfigError


def check_rows(estimator: Estimator, layout: Layout, group_size: int | None = None) -> None:
    """Raise `TrainingConfigError`, naming the key to change, when rows of ``layout`` from groups of
    ``group_size`` episodes (None: not known here) cannot feed ``estimator``."""
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
    """``(advantages, returns)``: per row ``[B]`` (GRPO, GiGPO) or per token ``[B, L]`` (GAE, which also returns
    the value targets; ``values`` are the critic's, required then)."""
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
