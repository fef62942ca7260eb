"""`EngineRouter`: several engine replicas (data-parallel generation) behind the one-engine interface.

Routing is sticky per conversation key: every turn of an episode goes to the replica that served its first
turn, so that replica's prefix cache already holds the conversation. A new key goes to the replica with the
fewest live conversations. Weight loads, sleep and wake go to every replica at once.

A streamed weight load (buckets, `engines.base.Weights`) can be read only once, so the router reads it and hands
each bucket to every replica, all loading at once, and takes the next bucket only when every replica is done with
this one: one bucket is alive at a time, whatever the number of replicas. Replicas that cannot load beside a
sibling (``concurrent_loads = False``: in-process vLLM engines share one process-wide lock) are loaded one after
the other instead, from a list of the buckets the router keeps until the last replica has loaded: references to
the caller's tensors, which costs nothing when they are the trainer's own parameters, and one full copy when the
buckets are gathered (FSDP2) or converted. Real data-parallel vLLM runs one engine per rank (one process each).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence

from roll_lightning.rollout.engines.base import (
    BucketFeed,
    Generation,
    GenerationEngine,
    SamplingParams,
    Weights,
    iter_buckets,
)

log = logging.getLogger(__name__)


class EngineRouter:
    def __init__(self, replicas: Sequence[GenerationEngine]) -> None:
        if not replicas:
            raise ValueError("EngineRouter needs at least one replica")
        self.replicas = list(replicas)
        self._route: dict[str, int] = {}
        self._load: Counter[int] = Counter()
        self.routed = Counter[int]()

    @property
    def policy_version(self) -> int:
        return min(r.policy_version for r in self.replicas)

    def replica_for(self, key: str) -> int:
        if key not in self._route:
            self._route[key] = min(range(len(self.replicas)), key=lambda i: (self._load[i], i))
            self._load[self._route[key]] += 1
        return self._route[key]

    def release(self, key: str) -> None:
        """Forget a finished conversation (frees its slot in the balance)."""
        index = self._route.pop(key, None)
        if index is not None:
            self._load[index] -= 1

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        index = self.replica_for(key) if key else min(range(len(self.replicas)), key=lambda i: self._load[i])
        self.routed[index] += 1
        return await self.replicas[index].generate(prompt_ids, params, key=key)

    async def load_weights(self, weights: Weights, version: int) -> None:
        if isinstance(weights, Mapping):  # a mapping can be read by every replica
            await asyncio.gather(*(r.load_weights(weights, version) for r in self.replicas))
        elif len(self.replicas) == 1:
            await self.replicas[0].load_weights(weights, version)
        elif all(getattr(r, "concurrent_loads", True) for r in self.replicas):
            await self._load_in_lock_step(weights, version)
        else:
            log.info("EngineRouter: replicas that cannot load side by side: loading them one after the other")
            # (copied as they come: a feed empties each bucket's list once the next one is asked for)
            buckets = await asyncio.to_thread(lambda: [list(bucket) for bucket in iter_buckets(weights)])
            try:
                for replica in self.replicas:
                    await replica.load_weights(iter(buckets), version)
            finally:
                buckets.clear()

    async def _load_in_lock_step(self, weights: Weights, version: int) -> None:
        feeds = [BucketFeed() for _ in self.replicas]

        async def load(replica: GenerationEngine, feed: BucketFeed) -> None:
            try:
                await replica.load_weights(feed, version)
            finally:
                feed.stop()

        def fan_out() -> None:  # on a thread: reading the source may wait on its producer
            try:
                for bucket in iter_buckets(weights):
                    for feed in feeds:
                        feed.offer(bucket)  # each feed keeps its own list: a replica done early empties only its own
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
            *(load(r, f) for r, f in zip(self.replicas, feeds, strict=True)),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            # the source's own failure first; a replica that failed keeps its old policy version
            raise errors[0]

    async def sleep(self) -> None:
        await asyncio.gather(*(r.sleep() for r in self.replicas))

    async def wake(self) -> None:
        await asyncio.gather(*(r.wake() for r in self.replicas))

    async def reset_prefix_cache(self) -> None:
        await asyncio.gather(*(r.reset_prefix_cache() for r in self.replicas))

    def stats(self) -> dict[str, float]:
        total: Counter[str] = Counter()
        for replica in self.replicas:
            total.update(replica.stats())
        total["uptime_s"] = max(r.stats().get("uptime_s", 0.0) for r in self.replicas)
        return {k: float(v) for k, v in total.items()}

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.replicas))
