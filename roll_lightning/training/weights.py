"""The policy's weights as the engine takes them after every update: buckets of full tensors, gathered from their
shards one at a time as the engine loads them, or LoRA's adapters or merged weights (docs/architecture.md,
"Weight sync"). `rollout.handover.Handover.publish` loads them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import torch

from roll_lightning.rollout.handover import AdapterWeights, PolicyUpdate, WeightBuckets, tensor_bytes

DEFAULT_BUCKET_BYTES = 256 * 2**20


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A full CPU copy of the weights (for ``bench/weight_sync.py``)."""
    out = {}
    for name, value in model.state_dict().items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = tensor.detach().to("cpu", copy=True)
    return out


def state_entries(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The state dict's entries as held (no copy), a tied tensor once."""
    seen: set[int] = set()
    for name, value in model.state_dict(keep_vars=True).items():
        if id(value) not in seen:
            seen.add(id(value))
            yield name, value


def gathered(value: torch.Tensor) -> torch.Tensor:
    """The full tensor (a DTensor gathered: a collective)."""
    with torch.no_grad():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
    return tensor.detach()


def bucketed(
    entries: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    gather: Callable[[torch.Tensor], torch.Tensor] = gathered,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of at most ``bucket_bytes`` (a larger tensor alone), each tensor gathered as it joins."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in entries:
        n = tensor_bytes(value)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, gather(value)))
        size += n
    if bucket:
        yield bucket


def weight_buckets(model: torch.nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    return bucketed(state_entries(model), bucket_bytes)


def policy_update(actor: torch.nn.Module, *, adapters: bool, bucket_bytes: int) -> PolicyUpdate:
    """The actor's weights for the engine; with LoRA its adapters (``adapters``: the engine applies them itself)
    or its merged weights."""
    from roll_lightning.training import lora

    if not lora.is_lora(actor):
        return WeightBuckets(weight_buckets(actor, bucket_bytes))
    if not adapters:
        return WeightBuckets(bucketed(lora.merged_entries(actor), bucket_bytes))
    started = time.perf_counter()
    tensors, config = lora.adapter_tensors(actor), lora.adapter_config(actor)
    return AdapterWeights(tensors, config, gather_s=time.perf_counter() - started)
