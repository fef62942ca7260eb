"""Ids and segments: turning the batch's string ids into integer tensors, and group/segment statistics.

`RolloutBatch` carries ``traj_group_id``, ``traj_id`` and ``anchor`` as lists of strings; the advantage
functions take integer tensors ``[B]`` instead (any ints: only equality matters). Convert with:

    group_ids = ids_to_index(batch.traj_group_id)
    traj_ids = ids_to_index(batch.traj_id)
    anchors = anchor_ids(batch.anchor)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import torch
from torch import Tensor


def ids_to_index(ids: Sequence[Hashable]) -> Tensor:
    """Map ids to consecutive ints in first-seen order: ``["b", "a", "b"] -> [0, 1, 0]`` (LongTensor ``[B]``)."""
    seen: dict[Hashable, int] = {}
    return torch.tensor([seen.setdefault(key, len(seen)) for key in ids], dtype=torch.long)


def _hashable(obs: object) -> Hashable:
    # Exact equality, like verl-agent's `to_hashable` and ROLL's sha256 state hash; dtype and shape are part of
    # the key (as in ROLL: verl-agent ignores the shape), so a 2x3 and a 3x2 grid never share an anchor.
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
    """Integer id per anchor observation ``[B]``: equal ids iff the observations are identical.

    Strings compare as strings; arrays/tensors by dtype, shape and bytes; lists/dicts recursively. Ids are
    per call (first-seen order), which is all GiGPO needs: anchors are only compared within one batch.
    """
    return ids_to_index([_hashable(a) for a in anchors])


def dense_index(*keys: Tensor) -> tuple[Tensor, int]:
    """Consecutive ids ``[0, n)`` for the distinct tuples ``(keys[0][i], keys[1][i], ...)``, and ``n``."""
    stacked = torch.stack([k.reshape(-1).long() for k in keys], dim=1)
    unique, inverse = torch.unique(stacked, dim=0, return_inverse=True)
    return inverse, int(unique.shape[0])


def group_normalize(
    values: Tensor,
    index: Tensor,
    num_groups: int,
    *,
    norm_by_std: bool,
    eps: float,
    stats_rows: Tensor | None = None,
) -> Tensor:
    """``(x_i - mean_g) / (std_g + eps)`` (or ``x_i - mean_g``) per group; 0 for degenerate groups.

    ``index[i]`` in ``[0, num_groups)`` is row i's group; ``stats_rows`` (bool ``[B]``, default all) picks the rows
    whose values form the statistics (every row still gets an output). ``std_g`` is the unbiased (N-1) sample
    std, as ``torch.std``. Groups with fewer than 2 statistic rows, or (std mode) ``std_g <= eps``, give 0
    (ROLL's rule; verl-agent gives singletons ``x_i / (1 + eps)`` instead).
    """
    # float64 for the statistics: a group of identical float32 scores then centres to exactly 0.
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
    """Number the maximal runs of response tokens in each row: 1, 2, ... (0 off the mask), ``[B, L]``.

    In a trajectory row each run is one assistant turn (observation tokens sit between runs): pass the result
    as ``seq_ids`` to `gspo_policy_loss` for ROLL's per-turn ("segment") GSPO ratio.
    """
    mask = response_mask.bool()
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=False)
    starts = mask & ~previous
    return torch.where(mask, starts.long().cumsum(-1), 0)
