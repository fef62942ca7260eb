"""Batch ids to integer tensors (only equality matters), and group statistics."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
from torch import Tensor


def ids_to_index(ids: Sequence[Hashable]) -> Tensor:
    """``["b", "a", "b"] -> [0, 1, 0]``."""
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(key, len(seen)) for key in ids], dtype=torch.long)


def _hashable(obs: object) -> Hashable:
    # shape is part of the key (not in verl-agent): a 2x3 and a 3x2 grid differ
    if isinstance(obs, torch.Tensor):
        obs = obs.detach().cpu().numpy()
    if isinstance(obs, np.ndarray):
        return ("ndarray", str(obs.dtype), obs.shape, np.ascontiguousarray(obs).tobytes())
    if isinstance(obs, list | tuple):
        return tuple(_hashable(x) for x in obs)
    if isinstance(obs, dict):
        return tuple(sorted((str(k), _hashable(v)) for k, v in obs.items()))
    return obs  # type: ignore[return-value]  # str / bytes / numbers / None


def anchor_ids(anchors: Sequence[object]) -> Tensor:
    """Integer ids, equal iff the anchor observations are identical."""
    return ids_to_index([_hashable(a) for a in anchors])


def dense_index(*keys: Tensor) -> tuple[Tensor, int]:
    """Ids ``[0, n)`` of the distinct key tuples, and ``n``."""
    stacked = torch.stack([k.reshape(-1).long() for k in keys], dim=1)
    unique, inverse = torch.unique(stacked, dim=0, return_inverse=True)
    return inverse, int(unique.shape[0])


def first_row_per_traj(group_ids: Tensor, traj_ids: Tensor) -> Tensor:
    """A mask of each trajectory's first row: statistics over trajectories count each once."""
    key, n = dense_index(group_ids, traj_ids)
    rows = torch.arange(key.numel(), device=key.device)
    first = torch.full((n,), key.numel(), dtype=torch.long, device=key.device).scatter_reduce(0, key, rows, "amin")
    out = torch.zeros(key.numel(), dtype=torch.bool, device=key.device)
    out[first] = True
    return out


def group_normalize(
    values: Tensor,
    index: Tensor,
    num_groups: int,
    *,
    norm_by_std: bool,
    eps: float,
    stats_rows: Tensor | None = None,
) -> Tensor:
    """``(x_i - mean_g) / (std_g + eps)`` or ``x_i - mean_g`` over ``stats_rows``; degenerate groups give 0."""
    # float64: identical float32 scores centre to exactly 0
    x = values.detach().to(torch.float64)
    if stats_rows is None:
        stats_rows = torch.ones_like(index, dtype=torch.bool)
    g, xs = index[stats_rows], x[stats_rows]
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=x.device)
    count = zeros.index_add(0, g, torch.ones_like(xs))
    mean = zeros.index_add(0, g, xs) / count.clamp(min=1)
    sq_dev = zeros.index_add(0, g, (xs - mean[g]) ** 2)  # two-pass: no catastrophic cancellation
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    centred = x - mean[index]
    out = centred / (std[index] + eps) if norm_by_std else centred
    degenerate = count[index] < 2
    if norm_by_std:
        degenerate |= std[index] <= eps
    out = torch.where(degenerate, torch.zeros_like(out), out)
    dtype = values.dtype if values.is_floating_point() else torch.get_default_dtype()
    return out.to(dtype)


def segment_ids(response_mask: Tensor) -> Tensor:
    """Number each row's runs of reply tokens (its turns) 1, 2, ...; 0 off the mask."""
    mask = response_mask.bool()
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    starts = mask & ~previous
    return torch.where(mask, starts.long().cumsum(-1), 0)


def time_order(traj_ids: Tensor, step_index: Tensor) -> list[int]:
    """Row indices by trajectory, then by step within it."""
    traj, step = traj_ids.tolist(), step_index.tolist()
    return sorted(range(len(traj)), key=lambda i: (traj[i], step[i]))


def next_rows(traj_ids: Tensor, step_index: Tensor) -> Tensor:
    """For each row, the index of the row after it in time in the same trajectory, or -1 (step rows of an episode
    chain; a trajectory row, alone in its trajectory, has none). Two rows of one trajectory at one step are an
    error."""
    traj, step = traj_ids.tolist(), step_index.tolist()
    order = time_order(traj_ids, step_index)
    out = [-1] * len(traj)
    for i, following in zip(order, order[1:], strict=False):
        if traj[following] == traj[i]:
            if step[following] == step[i]:
                raise ValueError(f"trajectory {traj[i]} has two rows with step {step[i]}")
            out[i] = following
    return torch.tensor(out, dtype=torch.long)
