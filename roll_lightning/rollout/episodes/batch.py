"""`RolloutBatch`: training rows from finished episodes. ``behaviour_logprobs[b, t]`` is the engine's log-prob of
``input_ids[b, t]`` (0 off the response), so the trainer's comes from the logits at ``t - 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from roll_lightning.rollout.episodes.episode import Episode
from roll_lightning.rollout.episodes.layout import TRAJECTORY, Layout, Row, layout_named
from roll_lightning.rollout.prompts.vision import PromptImage

TENSOR_FIELDS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "prompt_mask",
    "behaviour_logprobs",
    "scores",
    "step_scores",
    "episode_scores",
    "step",
    "policy_version",
)


@dataclass
class RolloutBatch:
    """Rows for one training step (`layout.Layout` makes them).

    ``scores``: each turn's reward on its last reply token (a row sums to its return); ``step_scores`` and
    ``step``: the row's turn reward and index (trajectory rows: return and turn count); ``policy_version``: the
    oldest weights in the row; ``anchor``: the observation its first reply answered; ``episode_metrics``: one
    dict per episode, not per row.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    scores: torch.Tensor
    step_scores: torch.Tensor
    episode_scores: torch.Tensor
    step: torch.Tensor
    policy_version: torch.Tensor
    traj_group_id: list[str]
    traj_id: list[str]
    env_ids: list[str]
    anchor: list[str]
    layout: Layout = TRAJECTORY
    episode_metrics: list[dict[str, float]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    episodes: list[Episode] = field(default_factory=list, repr=False)  # for dumps and debugging
    images: list[tuple[PromptImage, ...]] = field(default_factory=list, repr=False)

    @property
    def has_images(self) -> bool:
        return any(self.images)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def to(self, device: torch.device | str) -> RolloutBatch:
        return self._replace({name: getattr(self, name).to(device) for name in TENSOR_FIELDS})

    def select(self, index: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """The rows at ``index`` (episode_metrics stay whole: they describe the rollout)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        values: dict[str, Any] = {name: getattr(self, name)[idx] for name in TENSOR_FIELDS}
        for name in ("traj_group_id", "traj_id", "env_ids", "anchor"):
            values[name] = [getattr(self, name)[i] for i in rows]
        if self.images:
            values["images"] = [self.images[i] for i in rows]
        return self._replace(values)

    def truncate(self, width: int) -> RolloutBatch:
        """The rows cut to their first ``width`` positions (drops padding)."""
        two_d = {name for name in TENSOR_FIELDS if getattr(self, name).dim() == 2}
        return self._replace({name: getattr(self, name)[:, :width] for name in two_d})

    def _replace(self, values: dict[str, Any]) -> RolloutBatch:
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        return RolloutBatch(**{**current, **values})


def collate(episodes: Sequence[Episode], layout: Layout | str, pad_id: int) -> RolloutBatch:
    """Padded rows of ``layout`` (a `Layout` or its name) from finished episodes."""
    layout = layout_named(layout)
    rows: list[Row] = [row for ep in episodes for row in layout.rows(ep)]
    if not rows:
        raise ValueError("collate: no rows (every episode had zero turns)")
    width = max(len(r.ids) for r in rows)
    n = len(rows)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    response = torch.zeros((n, width), dtype=torch.bool)
    prompt = torch.zeros((n, width), dtype=torch.bool)
    logprobs = torch.zeros((n, width), dtype=torch.float32)
    scores = torch.zeros((n, width), dtype=torch.float32)
    for i, r in enumerate(rows):
        length = len(r.ids)
        input_ids[i, :length] = torch.tensor(r.ids, dtype=torch.long)
        attention[i, :length] = 1
        response[i, :length] = torch.tensor(r.response, dtype=torch.bool)
        logprobs[i, :length] = torch.tensor(r.logprobs, dtype=torch.float32)
        first_reply = r.response.index(True) if True in r.response else length
        prompt[i, :first_reply] = True
        for position, reward in r.rewards:
            scores[i, position] = reward
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0) * attention
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        response_mask=response,
        prompt_mask=prompt,
        behaviour_logprobs=logprobs,
        scores=scores,
        step_scores=torch.tensor([r.step_score for r in rows], dtype=torch.float32),
        episode_scores=torch.tensor([r.episode.score for r in rows], dtype=torch.float32),
        step=torch.tensor([r.step for r in rows], dtype=torch.long),
        policy_version=torch.tensor([r.version for r in rows], dtype=torch.long),
        traj_group_id=[r.episode.group_key for r in rows],
        traj_id=[r.episode.traj_key for r in rows],
        env_ids=[r.episode.env_id for r in rows],
        anchor=[r.anchor for r in rows],
        layout=layout,
        episode_metrics=[ep.metrics() for ep in episodes],
        episodes=list(episodes),
        images=[r.images for r in rows] if any(r.images for r in rows) else [],
    )
