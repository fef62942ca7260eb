"""FSDP2 (`fully_shard`) for transformers models: every repeated block, then the root."""

from __future__ import annotations

from typing import Any

import torch


def shard_fsdp2(model: torch.nn.Module, mesh: Any, dtype: str) -> None:
    """Shard ``model`` in place, each ``_no_split_modules`` block (decoder layer) on its own."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if dtype == "bfloat16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    backbone = getattr(model, "backbone", None)  # the critic
    if backbone is not None:
        block_names |= set(getattr(backbone, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    if not blocks:
        raise ValueError(f"{type(model).__name__}: no _no_split_modules blocks to shard with FSDP2")
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
