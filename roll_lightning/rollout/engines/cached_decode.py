"""`decode`: batched sampling that starts each row from its conversation's cached keys/values (`TurnCache`).

A batch lays each row out as [padding | its cached tokens | padding | its new prompt tokens], with explicit
positions and an attention mask over the holes, so rows with different cached and new lengths share one forward.
A row leaves the batch when it stops, taking its keys/values along as its conversation's next entry; the sampled
distribution and its log-probs are those of `model.generate` (the same logits processors, in the same order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import (
    LogitsProcessorList,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from roll_lightning.rollout.engines.base import FinishReason, SamplingParams
from roll_lightning.rollout.engines.turn_cache import TurnKV


@dataclass
class Row:
    """One request in a batch: its prompt, its token budget, and the cached entry covering ``reused`` tokens."""

    prompt: list[int]
    budget: int
    past: TurnKV | None = None
    reused: int = 0


@dataclass
class Decoded:
    token_ids: list[int]
    logprobs: list[float]
    reason: FinishReason
    kv: TurnKV  # prompt + reply but its last token


def supports_turn_cache(model: torch.nn.Module) -> bool:
    """Only text models whose every layer keeps a plain full-attention cache (no sliding windows, no recurrent
    state); vision-language models place their positions by picture (M-RoPE), which this loop does not."""
    if getattr(model.config, "vision_config", None) is not None:
        return False
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - a config the cache cannot read: use `model.generate`
        return False
    return all(type(layer) is DynamicLayer for layer in cache.layers) and not model.config.is_encoder_decoder


def processors(params: SamplingParams, suppressed: list[int], device: torch.device) -> LogitsProcessorList:
    """`model.generate`'s processors for ``params``: suppression, then temperature, top-k, top-p when sampling."""
    out = LogitsProcessorList()
    if suppressed:
        out.append(SuppressTokensLogitsProcessor(suppressed, device=device))
    if params.temperature == 0:
        return out
    if params.temperature != 1.0:
        out.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        out.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        out.append(TopPLogitsWarper(params.top_p))
    return out


@torch.no_grad()
def decode(
    model: torch.nn.Module,
    rows: list[Row],
    params: SamplingParams,
    *,
    stops: set[int],
    suppressed: list[int],
    pad_id: int,
    version: int,
    stopped_by_text: Callable[[list[int]], bool],
    interrupted: Callable[[], bool],
) -> list[Decoded]:
    """Sample every row's reply; ``stopped_by_text(reply)`` says a stop string completed, ``interrupted()`` that the
    engine was interrupted (every row then ends where it is, ``abort``)."""
    device = next(model.parameters()).device
    warp = processors(params, suppressed, device)
    batch = len(rows)

    # 1. Lay out [pad | cached | pad | new prompt tokens]; the cache holds the first part, the forward the second.
    cached = max(r.reused for r in rows)
    fresh = max(len(r.prompt) - r.reused for r in rows)
    mask_rows, id_rows, position_rows = [], [], []  # built as lists: one tensor each, not four ops per row
    for row in rows:
        new, hole = row.prompt[row.reused :], fresh - (len(row.prompt) - row.reused)
        mask_rows.append([0] * (cached - row.reused) + [1] * row.reused + [0] * hole + [1] * len(new))
        id_rows.append([pad_id] * hole + new)
        position_rows.append([1] * hole + list(range(row.reused, len(row.prompt))))
    mask = torch.tensor(mask_rows, dtype=torch.long)
    input_ids = torch.tensor(id_rows, dtype=torch.long)
    positions = torch.tensor(position_rows, dtype=torch.long)
    cache = DynamicCache(config=model.config)
    if cached:
        for layer, kv in enumerate(_merged_past(rows, cached)):
            cache.layers[layer].update(*kv)

    # 2. Prefill, then one token per live row per step; a row that stops leaves the batch.
    live = list(range(batch))  # row index of each batch position
    last = torch.tensor([len(r.prompt) - 1 for r in rows])
    replies: list[list[int]] = [[] for _ in rows]
    logps: list[list[float]] = [[] for _ in rows]
    results: list[Decoded | None] = [None] * batch
    step_input, step_mask, step_pos = input_ids, mask, positions
    while live:
        out = model(
            input_ids=step_input.to(device),
            attention_mask=step_mask.to(device),
            position_ids=step_pos.to(device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        scores = warp(None, out.logits[:, -1, :].float())  # none of these processors reads the ids
        if params.temperature == 0:
            tokens = scores.argmax(-1)
        else:
            tokens = torch.multinomial(torch.softmax(scores, -1), 1).squeeze(-1)
        chosen = torch.log_softmax(scores, -1).gather(-1, tokens[:, None]).squeeze(-1).cpu().tolist()
        stop_all = interrupted()
        keep: list[int] = []
        for at, (i, token) in enumerate(zip(live, tokens.cpu().tolist(), strict=True)):
            replies[i].append(token)
            logps[i].append(chosen[at])
            reason = _finished(replies[i], rows[i].budget, stops, stopped_by_text, stop_all)
            if reason is None:
                keep.append(at)
            else:
                kv = _row_kv(cache, at, step_mask[at], [*rows[i].prompt, *replies[i][:-1]], version)
                results[i] = Decoded(replies[i], logps[i], reason, kv)
        if len(keep) < len(live):
            index = torch.tensor(keep, dtype=torch.long)
            cache.batch_select_indices(index.to(device))
            step_mask, last = step_mask[index], last[index]
            live = [live[at] for at in keep]
            tokens = tokens[index.to(tokens.device)]
        last = last + 1
        step_input = tokens[:, None].cpu()
        step_mask = torch.cat([step_mask, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
        step_pos = last[:, None]
    return [r for r in results if r is not None]


def _finished(
    reply: list[int], budget: int, stops: set[int], stopped_by_text: Callable[[list[int]], bool], interrupted: bool
) -> FinishReason | None:
    if reply[-1] in stops or stopped_by_text(reply):
        return "stop"
    if len(reply) >= budget:
        return "length"
    return "abort" if interrupted else None


def _merged_past(rows: list[Row], cached: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values for the batch, [batch, heads, cached, dim], each row's right-aligned."""
    template = next(r.past for r in rows if r.past is not None)
    merged = []
    for layer, (k0, v0) in enumerate(template.layers):
        keys = [_reused(row, layer, 0, k0) for row in rows]
        values = [_reused(row, layer, 1, v0) for row in rows]
        merged.append((_left_padded(keys), _left_padded(values)))
    return merged


def _reused(row: Row, layer: int, part: int, like: torch.Tensor) -> torch.Tensor:
    """Row ``row``'s reused keys (``part`` 0) or values (1) of ``layer``, [reused, heads, dim]."""
    if row.past is None or not row.reused:
        return like.new_zeros((0, like.shape[0], like.shape[2]))
    return row.past.layers[layer][part][:, : row.reused].transpose(0, 1)


def _left_padded(parts: list[torch.Tensor]) -> torch.Tensor:
    """[reused_i, heads, dim] tensors as one [batch, heads, longest, dim], zeros on the left (one op, not a slice
    assignment per row: those were 16% of the main command's engine thread)."""
    return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_side="left").transpose(1, 2)


def _row_kv(cache: DynamicCache, at: int, mask: torch.Tensor, tokens: list[int], version: int) -> TurnKV:
    """Batch position ``at``'s keys/values without its padding: its prompt and reply but the reply's last token."""
    slots = mask.bool().nonzero().squeeze(-1).to(cache.layers[0].keys.device)
    assert slots.numel() == len(tokens), (slots.numel(), len(tokens))
    layers = [(layer.keys[at][:, slots], layer.values[at][:, slots]) for layer in cache.layers]
    return TurnKV(tokens, layers, version)
