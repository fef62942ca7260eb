"""`WeightSync`: after every update the new weights stream into the engine in buckets (docs/architecture.md,
"Weight sync")."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import lightning as L
import torch

from roll_lightning.rollout.datamodule import rollout_of
from roll_lightning.rollout.engines.base import AdapterEngine, BucketFeed

if TYPE_CHECKING:
    from roll_lightning.training.module import AgentRLModule

log = logging.getLogger(__name__)

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


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


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


def stream_weights(
    model: torch.nn.Module,
    feed: BucketFeed,
    bucket_bytes: int,
    entries: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> dict[str, float]:
    """Hand each bucket to ``feed``; every bucket is made even if the engine failed (gathers are collectives)."""
    stats = {"gather_s": 0.0, "load_s": 0.0, "bytes": 0.0, "buckets": 0.0, "delivered": 0.0}
    buckets = weight_buckets(model, bucket_bytes) if entries is None else bucketed(entries, bucket_bytes)
    while True:
        t0 = time.perf_counter()
        bucket = next(buckets, None)
        t1 = time.perf_counter()
        stats["gather_s"] += t1 - t0
        if bucket is None:
            break
        stats["buckets"] += 1
        stats["bytes"] += sum(tensor_bytes(t) for _, t in bucket)
        stats["delivered"] += feed.put(bucket)
        del bucket  # one bucket alive at a time
        stats["load_s"] += time.perf_counter() - t1
    feed.close()
    return stats


class WeightSync(L.Callback):
    """Loads the actor's weights into the engine after each update, and at start if the engine is behind."""

    def __init__(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if bucket_bytes < 1:
            raise ValueError(f"WeightSync: bucket_bytes must be >= 1, got {bucket_bytes}")
        self.bucket_bytes = int(bucket_bytes)

    def after_update(self, trainer: L.Trainer, pl_module: AgentRLModule) -> None:
        timings = self._sync(trainer, pl_module)
        if timings is not None:
            pl_module.log_dict(timings, on_step=True, batch_size=1)

    def on_train_start(self, trainer: L.Trainer, pl_module: AgentRLModule) -> None:
        self._catch_up(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: AgentRLModule) -> None:
        self._catch_up(trainer, pl_module)

    def _catch_up(self, trainer: L.Trainer, pl_module: AgentRLModule) -> None:
        """Sync if the engine is behind; every rank decides alike."""
        rollout = rollout_of(trainer)
        if rollout is not None and rollout.engine.policy_version != pl_module.policy_version:
            engine = rollout.engine
            behind = engine.policy_version
            self._sync(trainer, pl_module)
            log.warning(
                "WeightSync: the engine had policy version %d; loaded the restored %d", behind, engine.policy_version
            )

    def _sync(self, trainer: L.Trainer, pl_module: AgentRLModule) -> dict[str, float] | None:
        """Suspend the rollout, stream the weights, resume."""
        rollout = rollout_of(trainer)
        if rollout is None or pl_module.actor is None:
            return None
        started = time.perf_counter()
        version = pl_module.policy_version
        rollout.call(rollout.scheduler.suspend())  # no reply may come from half-loaded weights
        stats = sync_actor(pl_module.actor, rollout.engine, version, self.bucket_bytes, rollout.call)
        rollout.call(rollout.scheduler.resume())  # drops groups now too stale
        done = time.perf_counter()
        return {
            "sync/total_s": done - started,
            "sync/gather_s": stats["gather_s"],
            "sync/load_s": stats["load_s"],
            "sync/policy_version": float(version),
            "sync/bytes": stats["bytes"],
            "sync/buckets": stats["buckets"],
            "sync/adapter": stats.get("adapter", 0.0),
        }


def takes_adapters(engine: object) -> bool:
    """vLLM with ``max_lora_rank``."""
    return isinstance(engine, AdapterEngine) and engine.takes_adapters


def sync_actor(
    actor: torch.nn.Module, engine: Any, version: int, bucket_bytes: int, call: Callable[[Any], Any]
) -> dict[str, float]:
    """The weights; with LoRA the adapters if the engine takes them, else merged weights."""
    from roll_lightning.training import lora

    if not lora.is_lora(actor):
        return stream_into_engine(actor, engine, version, bucket_bytes, call)
    if takes_adapters(engine):
        return send_adapter(actor, engine, version, call)
    return stream_into_engine(actor, engine, version, bucket_bytes, call, entries=lora.merged_entries(actor))


def send_adapter(
    actor: torch.nn.Module, engine: AdapterEngine, version: int, call: Callable[[Any], Any]
) -> dict[str, float]:
    """The LoRA adapters in one piece; ``adapter`` = 1."""
    from roll_lightning.training import lora

    t0 = time.perf_counter()
    tensors = lora.adapter_tensors(actor)
    config = lora.adapter_config(actor)
    t1 = time.perf_counter()
    call(engine.load_adapter(tensors, config, version))
    size = float(sum(tensor_bytes(t) for t in tensors.values()))
    stats = {"gather_s": t1 - t0, "load_s": time.perf_counter() - t1, "bytes": size, "buckets": 1.0}
    return {**stats, "delivered": 1.0, "adapter": 1.0}


def stream_into_engine(
    model: torch.nn.Module,
    engine: Any,
    version: int,
    bucket_bytes: int,
    call: Callable[[Any], Any],
    entries: Iterable[tuple[str, torch.Tensor]] | None = None,
) -> dict[str, float]:
    """Buckets are made on this thread (Lightning's device, for FSDP2) while ``call`` loads them on the engine's
    loop."""
    feed = BucketFeed()

    async def load() -> None:
        try:
            await engine.load_weights(feed, version)
        finally:
            feed.stop()

    with ThreadPoolExecutor(1, thread_name_prefix="weight-sync") as pool:
        loading = pool.submit(call, load())
        try:
            stats = stream_weights(model, feed, bucket_bytes, entries)
        except BaseException as err:
            feed.fail(err)
            with contextlib.suppress(BaseException):
                loading.result()
            raise
        loading.result()  # raises the engine's error
    if stats["delivered"] != stats["buckets"]:
        raise RuntimeError(
            f"WeightSync: the engine took {stats['delivered']:.0f} of {stats['buckets']:.0f} weight buckets"
        )
    return stats
