"""`EngineRouter`: engine replicas behind the one-engine interface (docs/architecture.md, "Engine replicas")."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll_lightning.rollout.engines.base import (
    BucketFeed,
    Generation,
    GenerationEngine,
    Interruptible,
    SamplingParams,
    Weights,
    iter_buckets,
    mark_seen,
)

log = logging.getLogger(__name__)


ACTIVE, PENDING, SHRUNK = "active", "pending", "shrunk"
"""A replica's state: serving; awake but waiting for the current weights (after `expand`); out of service."""


class EngineRouter:
    def __init__(self, replicas: Sequence[GenerationEngine], devices: Sequence[str] | None = None) -> None:
        """``devices``: the replicas' labels for `shrink`/`expand`."""
        if not replicas:
            raise ValueError("EngineRouter needs at least one replica")
        self.replicas = list(replicas)
        self.devices = list(devices) if devices is not None else [f"replica{i}" for i in range(len(self.replicas))]
        if len(self.devices) != len(self.replicas):
            raise ValueError(f"EngineRouter: {len(self.replicas)} replicas but {len(self.devices)} device labels")
        self.states = [ACTIVE] * len(self.replicas)
        self.version = min(r.policy_version for r in self.replicas)  # of the last load (what `expand` waits for)
        self._route: dict[str, int] = {}
        self._load: Counter[int] = Counter()
        self._epoch = [0] * len(self.replicas)  # bumped by each shrink: replies from an older epoch are dropped
        self._calls: list[set[asyncio.Future[Generation]]] = [set() for _ in self.replicas]
        self.routed = Counter[int]()
        self.counters: Counter[str] = Counter()

    @property
    def policy_version(self) -> int:
        """The oldest weights a serving replica generates with."""
        return min(self.replicas[i].policy_version for i in self.active)

    @property
    def concurrent_loads(self) -> bool:
        return all(r.concurrent_loads for r in self.replicas)

    @property
    def active(self) -> list[int]:
        """The replicas serving now."""
        return [i for i, state in enumerate(self.states) if state == ACTIVE]

    def replica_for(self, key: str) -> int:
        if key not in self._route:
            self._route[key] = self._least_loaded()
            self._load[self._route[key]] += 1
        return self._route[key]

    def _least_loaded(self) -> int:
        return min(self.active, key=lambda i: (self._load[i], i))

    def release(self, key: str) -> None:
        """Forget a finished conversation."""
        index = self._route.pop(key, None)
        if index is not None:
            self._load[index] -= 1

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """A reply from a serving replica, asked again if `shrink` takes that replica first."""
        while True:
            index = self.replica_for(key) if key else self._least_loaded()
            epoch = self._epoch[index]
            self.routed[index] += 1
            call = asyncio.ensure_future(self.replicas[index].generate(prompt_ids, params, key=key))
            call.add_done_callback(mark_seen)
            self._calls[index].add(call)
            try:
                await asyncio.wait([call])  # not `await call`: a shrink cancels the call, not this coroutine
            finally:
                self._calls[index].discard(call)
                call.cancel()  # if this coroutine was cancelled, so is the call
            if self._epoch[index] == epoch:
                return call.result()
            self.counters["rerouted"] += 1  # shrunk meanwhile: ask a replica left

    # -- partial overlap -----------------------------------------------------------------------------

    def indices(self, devices: Sequence[str]) -> list[int]:
        """The replicas on ``devices``; an unknown label raises."""
        unknown = sorted(set(devices) - set(self.devices))
        if unknown:
            raise ValueError(f"EngineRouter: no replica on {unknown}; the replicas are on {self.devices}")
        return [i for i, device in enumerate(self.devices) if device in devices]

    async def shrink(
        self, devices: Sequence[str], free_memory: Callable[[str], int | None] | None = None
    ) -> dict[str, Any]:
        """Take the replicas on ``devices`` out of service and put them to sleep; return what moved.
        ``free_memory(device)`` (free bytes) measures ``released_bytes``."""
        targets = [i for i in self.indices(devices) if self.states[i] != SHRUNK]
        if targets and not [i for i in self.active if i not in targets]:
            raise ValueError(
                f"EngineRouter.shrink({list(devices)}): no replica would be left to generate (serving on "
                f"{[self.devices[i] for i in self.active]}); shrink fewer devices, or colocate instead"
            )
        aborted = migrated = 0
        for i in targets:
            self.states[i] = SHRUNK
            self._epoch[i] += 1
            aborted += sum(call.cancel() for call in list(self._calls[i]))
            moved = [key for key, index in self._route.items() if index == i]
            for key in moved:
                self.release(key)
            migrated += len(moved)
        shrunk = sorted({self.devices[i] for i in targets})
        before = {d: free_memory(d) for d in shrunk} if free_memory else {}
        await asyncio.gather(*(self.replicas[i].sleep() for i in targets))
        released = None
        if free_memory:
            after = {d: free_memory(d) for d in shrunk}
            deltas = [after[d] - before[d] for d in shrunk if before[d] is not None and after[d] is not None]
            released = float(sum(deltas)) if deltas else None
        self.counters.update(shrinks=1, aborted=aborted, migrated=migrated)
        log.info("EngineRouter: shrank %s (%d replies aborted, %d conversations moved)", shrunk, aborted, migrated)
        return {
            "replicas": targets,
            "devices": shrunk,
            "aborted": aborted,
            "migrated": migrated,
            "released_bytes": released,
            "active": self.active,
        }

    async def expand(self, devices: Sequence[str], skip_load: bool = False) -> dict[str, Any]:
        """Wake the shrunk replicas on ``devices``; each serves once it holds the last load (or, with
        ``skip_load``, at once)."""
        targets = [i for i in self.indices(devices) if self.states[i] == SHRUNK]
        await asyncio.gather(*(self.replicas[i].wake() for i in targets))
        for i in targets:
            current = skip_load or self.replicas[i].policy_version == self.version
            self.states[i] = ACTIVE if current else PENDING
        self.counters.update(expands=1)
        return {
            "replicas": targets,
            "devices": sorted({self.devices[i] for i in targets}),
            "serving": [i for i in targets if self.states[i] == ACTIVE],
            "pending": [i for i in targets if self.states[i] == PENDING],
            "skip_load": skip_load,
        }

    # -- weights and memory --------------------------------------------------------------------------

    async def load_weights(self, weights: Weights, version: int) -> None:
        """Load into every awake replica; a shrunk one stays behind until expanded and loaded."""
        targets = [self.replicas[i] for i, state in enumerate(self.states) if state != SHRUNK]
        if isinstance(weights, Mapping):  # a mapping can be read by every replica
            await asyncio.gather(*(r.load_weights(weights, version) for r in targets))
        elif len(targets) == 1:
            await targets[0].load_weights(weights, version)
        elif all(r.concurrent_loads for r in targets):
            await self._load_in_lock_step(targets, weights, version)
        else:
            log.info("EngineRouter: replicas that cannot load side by side: loading them one after the other")
            # copied: a feed empties each bucket's list
            buckets = await asyncio.to_thread(lambda: [list(bucket) for bucket in iter_buckets(weights)])
            try:
                for replica in targets:
                    await replica.load_weights(iter(buckets), version)
            finally:
                buckets.clear()
        self.version = version
        for i, state in enumerate(self.states):
            if state == PENDING and self.replicas[i].policy_version == version:
                self.states[i] = ACTIVE

    async def _load_in_lock_step(self, targets: list[GenerationEngine], weights: Weights, version: int) -> None:
        feeds = [BucketFeed() for _ in targets]

        async def load(replica: GenerationEngine, feed: BucketFeed) -> None:
            try:
                await replica.load_weights(feed, version)
            finally:
                feed.stop()

        def fan_out() -> None:  # on a thread: reading the source may wait on its producer
            try:
                for bucket in iter_buckets(weights):
                    for feed in feeds:
                        feed.offer(bucket)  # copies: a replica done early empties only its own
                    for feed in feeds:
                        feed.wait_done()
                    del bucket
            except BaseException as err:
                for feed in feeds:
                    feed.fail(err)
                raise
            for feed in feeds:
                feed.close()

        results = await asyncio.gather(
            asyncio.to_thread(fan_out),
            *(load(r, f) for r, f in zip(targets, feeds, strict=True)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # the source's failure first
            raise errors[0]

    async def interrupt(self) -> None:
        """Every replica's replies in flight stop where they are (`Interruptible`); refused where one cannot."""
        for replica in self.replicas:
            if not isinstance(replica, Interruptible):
                raise TypeError(f"{type(replica).__name__} cannot stop its replies where they are")
        await asyncio.gather(*(replica.interrupt() for replica in self.replicas))

    async def sleep(self) -> None:
        await asyncio.gather(*(r.sleep() for r in self.replicas))

    async def wake(self) -> None:
        """Wake every replica but the shrunk ones (`expand` wakes those)."""
        await asyncio.gather(*(r.wake() for r, s in zip(self.replicas, self.states, strict=True) if s != SHRUNK))

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(*(r.reset_prefix_cache() for r in self.replicas))

    def stats(self) -> dict[str, float]:
        """The replicas' counters summed, plus the router's."""
        total: Counter[str] = Counter()
        for replica in self.replicas:
            total.update(replica.stats())
        total["uptime_s"] = max(r.stats().get("uptime_s", 0.0) for r in self.replicas)
        for name in ("shrinks", "expands", "aborted", "rerouted", "migrated"):
            total[f"router_{name}"] = self.counters[name]
        total["replicas_active"] = len(self.active)
        return {k: float(v) for k, v in total.items()}

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.replicas))
