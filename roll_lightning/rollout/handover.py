"""`Handover`: generation and training take turns on the engine. Before an update the engine steps aside (`pause`:
it sleeps, or its replicas on the training device shrink); after it, the new policy goes in (`publish`: wake or
expand, hold replies, load, let replies go on). The rollout's invariant lives here, beside its state: no reply
comes from half-loaded weights, and each publish lets generation go on exactly once.

The training side hands over a `PolicyUpdate` (its weights as buckets, or LoRA adapters) and never calls the
engine or the scheduler itself (docs/architecture.md, "One step").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from roll_lightning.rollout.engines.base import AdapterEngine, BucketFeed, GenerationEngine
from roll_lightning.rollout.engines.placement import TRAIN
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler

Bucket = Sequence[tuple[str, torch.Tensor]]
Call = Callable[[Coroutine[Any, Any, Any]], Any]  # runs a coroutine on the rollout's loop and waits


@dataclass(frozen=True)
class HandoffPlan:
    offload_optimizer: bool  # optimiser state on the CPU while generating
    sleep_engine: bool
    shrink_shared: bool = False  # the `train` replicas step aside

    @property
    def synchronize(self) -> bool:
        return self.offload_optimizer  # state back before the optimiser reads it

    @property
    def pauses(self) -> bool:
        """Generation stops (or shrinks) for the update."""
        return self.sleep_engine or self.shrink_shared


def plan_handoff(accelerator: str, colocate: bool | Literal["partial"]) -> HandoffPlan:
    """The optimiser state moves only on CUDA, where the engine needs the memory."""
    if colocate == "partial":
        return HandoffPlan(offload_optimizer=accelerator == "cuda", sleep_engine=False, shrink_shared=True)
    return HandoffPlan(offload_optimizer=bool(colocate) and accelerator == "cuda", sleep_engine=bool(colocate))


@dataclass(frozen=True)
class WeightBuckets:
    """Every weight, bucket by bucket. The buckets are made on the publishing thread while the engine loads them
    on the rollout's loop (making one may gather a sharded tensor: a collective every rank joins)."""

    buckets: Iterator[Bucket]


@dataclass(frozen=True)
class AdapterWeights:
    """LoRA adapters in one piece (PEFT names), for an engine that applies them itself (`AdapterEngine`)."""

    tensors: Mapping[str, torch.Tensor]
    config: Mapping[str, Any]
    gather_s: float = 0.0  # what making them took


PolicyUpdate = WeightBuckets | AdapterWeights


@dataclass
class Handover:
    """The engine's turns around each update, for one rank's rollout (built by `RolloutDataModule.setup`)."""

    engine: GenerationEngine
    scheduler: RolloutScheduler
    call: Call
    colocate: bool | Literal["partial"]
    _asleep: bool = field(default=False, init=False)
    _shrunk: bool = field(default=False, init=False)

    @property
    def takes_adapters(self) -> bool:
        """The engine applies LoRA adapters itself (vLLM with ``max_lora_rank``): publish `AdapterWeights`."""
        return takes_adapters(self.engine)

    @property
    def engine_version(self) -> int:
        """The policy version the engine generates with."""
        return self.engine.policy_version

    def plan(self, accelerator: str) -> HandoffPlan:
        return plan_handoff(accelerator, self.colocate)

    def pause(self, plan: HandoffPlan, free_memory: Callable[[str], int | None], train_device: str) -> dict[str, float]:
        """The batch is in: hold replies and let the engine sleep, or shrink its `train` replicas (the others
        generate on), as ``plan`` says. ``free_memory(device)``: free bytes there, to report what a shrink
        released."""
        if plan.shrink_shared:
            moved = self.call(
                self.scheduler.shrink_sampler(
                    [TRAIN], free_memory=lambda label: free_memory(train_device if label == TRAIN else label)
                )
            )
            self._shrunk = True
            return _moved_metrics("shrink", moved)
        if plan.sleep_engine:

            async def sleep() -> None:
                await self.scheduler.suspend()
                await self.engine.sleep()

            self.call(sleep())
            self._asleep = True
        return {}

    def publish(self, update: PolicyUpdate, version: int) -> dict[str, float]:
        """The engine wakes (or expands) if `pause` stepped it aside, then loads ``update`` as ``version`` with
        replies held; generation goes on once, after the whole load. Stale groups are dropped then."""
        out: dict[str, float] = {}
        started = time.perf_counter()
        if self._asleep:
            self.call(self.engine.wake())
            self._asleep = False
            out["timing/wake_s"] = time.perf_counter() - started
        elif self._shrunk:
            moved = self.call(self.scheduler.expand_sampler([TRAIN]))
            self._shrunk = False
            out["timing/expand_s"] = time.perf_counter() - started
            out.update(_moved_metrics("expand", moved))
        started = time.perf_counter()
        self.call(self.scheduler.suspend())  # no reply may come from half-loaded weights
        stats = load_update(self.engine, update, version, self.call)
        self.call(self.scheduler.resume())  # drops groups now too stale
        out.update(
            {
                "sync/total_s": time.perf_counter() - started,
                "sync/gather_s": stats["gather_s"],
                "sync/load_s": stats["load_s"],
                "sync/policy_version": float(version),
                "sync/bytes": stats["bytes"],
                "sync/buckets": stats["buckets"],
                "sync/adapter": float(isinstance(update, AdapterWeights)),
            }
        )
        return out


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _moved_metrics(what: str, moved: dict[str, Any]) -> dict[str, float]:
    values = {f"rollout/{what}_replicas": float(len(moved["replicas"]))}
    if what == "shrink":
        values["rollout/shrink_aborted"] = float(moved["aborted"])
        values["rollout/shrink_migrated"] = float(moved["migrated"])
        if moved["released_bytes"] is not None:
            values["rollout/shrink_released_gib"] = moved["released_bytes"] / 2**30
    return values


def feed_buckets(buckets: Iterator[Bucket], feed: BucketFeed) -> dict[str, float]:
    """Hand each bucket to ``feed`` as it is made; every bucket is made even if the engine failed (making one may
    be a collective)."""
    stats = {"gather_s": 0.0, "load_s": 0.0, "bytes": 0.0, "buckets": 0.0, "delivered": 0.0}
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


def load_buckets(engine: GenerationEngine, buckets: Iterator[Bucket], version: int, call: Call) -> dict[str, float]:
    """The buckets are made on this thread (Lightning's, for FSDP2) while ``call`` loads them on the engine's
    loop; raises unless the engine took every one."""
    feed = BucketFeed()

    async def load() -> None:
        try:
            await engine.load_weights(feed, version)
        finally:
            feed.stop()

    with ThreadPoolExecutor(1, thread_name_prefix="weight-sync") as pool:
        loading = pool.submit(call, load())
        try:
            stats = feed_buckets(buckets, feed)
        except BaseException as err:
            feed.fail(err)
            with contextlib.suppress(BaseException):
                loading.result()
            raise
        loading.result()  # raises the engine's error
    if stats["delivered"] != stats["buckets"]:
        raise RuntimeError(f"weight sync: the engine took {stats['delivered']:.0f} of {stats['buckets']:.0f} buckets")
    return stats


def takes_adapters(engine: GenerationEngine) -> bool:
    return isinstance(engine, AdapterEngine) and engine.takes_adapters


def load_update(engine: GenerationEngine, update: PolicyUpdate, version: int, call: Call) -> dict[str, float]:
    """Load ``update`` into ``engine`` as ``version`` (replies must be held by the caller); its sizes and times."""
    if isinstance(update, WeightBuckets):
        return load_buckets(engine, update.buckets, version, call)
    if not takes_adapters(engine):
        raise TypeError(f"{type(engine).__name__} takes no LoRA adapters: publish merged WeightBuckets")
    started = time.perf_counter()
    call(engine.load_adapter(update.tensors, update.config, version))  # type: ignore[attr-defined]
    size = float(sum(tensor_bytes(t) for t in update.tensors.values()))
    return {"gather_s": update.gather_s, "load_s": time.perf_counter() - started, "bytes": size, "buckets": 1.0}
