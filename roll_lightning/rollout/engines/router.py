"""`EngineRouter`: several engine replicas (data-parallel generation) behind the one-engine interface.

Routing is sticky per conversation key: every turn of an episode goes to the replica that served its first
turn, so that replica's prefix cache already holds the conversation. A new key goes to the replica with the
fewest live conversations. Weight loads, sleep and wake go to every replica at once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from roll_lightning.rollout.engines.base import Generation, GenerationEngine, SamplingParams


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

    async def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        await asyncio.gather(*(r.load_weights(state_dict, version) for r in self.replicas))

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
