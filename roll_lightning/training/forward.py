"""Forward passes over rollout rows, and micro-batch plans. ``logp[b, t]`` is token ``t``'s log-prob under
``log softmax(logits[t-1] / temperature)``, the engine's distribution; 0 at ``t = 0``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from roll_lightning.algorithms.losses import entropy_from_logits
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.rollout.prompts.vision import model_inputs, vision_token_ids


@dataclass(frozen=True)
class FixedMicroBatches:
    """``size`` consecutive rows, padded to the batch's width."""

    size: int
    pads_to_batch: ClassVar[bool] = True

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        return [list(range(i, min(i + self.size, len(lengths)))) for i in range(0, len(lengths), self.size)]


@dataclass(frozen=True)
class TokenBudgetMicroBatches:
    """Rows sorted longest first, cut into runs with ``rows x longest <= max_tokens`` that minimise the tokens
    computed (padding included) plus ``pass_tokens`` for each forward pass: rows of very different lengths go to
    different passes when that saves more padding than a pass costs (an exact dynamic programme over the runs)."""

    max_tokens: int
    pass_tokens: int = 0
    pads_to_batch: ClassVar[bool] = False

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        longest = np.array([lengths[i] for i in order], dtype=np.int64)
        n = len(order)
        cost = np.zeros(n + 1, dtype=np.int64)  # cost[i]: the best plan of rows i.. (sorted)
        take = np.ones(n, dtype=np.int64)  # the rows in the first run of that plan
        for i in range(n - 1, -1, -1):
            most = min(n - i, max(1, self.max_tokens // max(1, int(longest[i]))))  # a row over budget sits alone
            options = np.arange(1, most + 1) * longest[i] + cost[i + 1 : i + most + 1]
            take[i] = most - int(np.argmin(options[::-1]))  # on a tie, the longer run: fewer passes
            cost[i] = self.pass_tokens + options[take[i] - 1]
        plans, i = [], 0
        while i < n:
            plans.append(order[i : i + int(take[i])])
            i += int(take[i])
        return plans


MicroBatching = FixedMicroBatches | TokenBudgetMicroBatches


def trim(batch: RolloutBatch, rows: Sequence[int], *, pad_to_batch: bool) -> RolloutBatch:
    """The rows, cut to their longest unless ``pad_to_batch``."""
    part = batch.select(list(rows))
    if pad_to_batch:
        return part
    width = int(part.attention_mask.sum(-1).max())
    return part.truncate(width)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, *, with_entropy: bool = False, chunk: int = 512
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-aligned log-probs (and entropies)."""
    logp, entropy = target_logprobs(
        logits[:, :-1], input_ids[:, 1:], temperature, with_entropy=with_entropy, chunk=chunk
    )
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0)) if entropy is not None else None


def target_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    *,
    with_entropy: bool = False,
    chunk: int = 512,
    suppressed: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` (and entropy) without ``suppressed`` ids, in chunks: a whole float32 log-softmax
    (2k tokens, 50k vocabulary) is 400 MB kept by autograd."""
    logps, entropies = [], []
    for start in range(0, logits.shape[1], chunk):
        part = logits[:, start : start + chunk].float() / temperature
        if suppressed:
            part = part.index_fill(-1, torch.tensor(suppressed, device=part.device), float("-inf"))
        norm = torch.logsumexp(part, dim=-1)
        logps.append(part.gather(-1, targets[:, start : start + part.shape[1], None]).squeeze(-1) - norm)
        if with_entropy:  # suppressed ids are -inf: p = 0, not NaN
            entropies.append(entropy_from_logits(part))
    empty = logits.new_zeros(targets.shape, dtype=torch.float32)
    logp = torch.cat(logps, dim=1) if logps else empty
    entropy = (torch.cat(entropies, dim=1) if entropies else empty) if with_entropy else None
    return logp, entropy


def policy_forward(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of reply tokens, 0 elsewhere; the head runs only where one is predicted (on a
    whole step row it costs as much as the model)."""
    width = batch.input_ids.shape[1]
    wanted = batch.response_mask[:, 1:].bool().any(0).nonzero().squeeze(-1)  # logits at t - 1 predict t
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        **_positions(model, batch),
        logits_to_keep=wanted,
        use_cache=False,  # a training forward: no keys/values to keep (HF builds a cache by default)
    )
    suppressed = vision_token_ids(_config(model))
    targets = batch.input_ids[:, wanted + 1]
    logp, entropy = target_logprobs(out.logits, targets, temperature, with_entropy=with_entropy, suppressed=suppressed)
    zeros = logp.new_zeros((logp.shape[0], width))
    return zeros.index_copy(1, wanted + 1, logp), zeros.index_copy(
        1, wanted + 1, entropy
    ) if entropy is not None else None


class ValueModel(torch.nn.Module):
    """A critic: the LM's backbone with a scalar head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: RolloutBatch) -> torch.Tensor:
        out = self.backbone(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **_positions(self, batch)
        )
        return self.head(out.last_hidden_state).squeeze(-1).float()


def _positions(model: torch.nn.Module, batch: RolloutBatch) -> dict[str, torch.Tensor]:
    """``position_ids``, or the pictures' inputs (the model computes M-RoPE positions)."""
    if not batch.has_images:
        return {"position_ids": batch.position_ids}
    return model_inputs(batch.input_ids, batch.images, _config(model).image_token_id)


def _config(model: torch.nn.Module) -> Any:
    return getattr(model, "config", None) or model.backbone.config  # the critic
