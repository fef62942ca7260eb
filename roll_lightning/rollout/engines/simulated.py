"""`SimulatedEngine`: a stand-in engine for scheduling tests and benchmarks, never for training.

Each call sleeps a latency (fixed or drawn per reply), as if unlimited concurrent requests were batched, and
returns one of the given replies with placeholder log-probs. Busy time is time with a request in flight. An
`interrupt` ends every sleep at once, each reply cut to the share of its latency that had passed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from roll_lightning.rollout.engines.base import Generation, SamplingParams, Weights, iter_buckets

PLACEHOLDER_LOGPROB = -1.0


class SimulatedEngine:
    concurrent_loads = True

    def __init__(
        self, tokenizer: Any, replies: Sequence[str], *, latency_s: float | Callable[[], float] = 0.05, seed: int = 0
    ) -> None:
        if not replies:
            raise ValueError("SimulatedEngine needs at least one reply text")
        self.policy_version = 0
        self.latency_s = latency_s
        eos = tokenizer.eos_token_id
        self._replies = [tokenizer.encode(text, add_special_tokens=False) + [eos] for text in replies]
        self._rng = random.Random(seed)
        self._in_flight = 0
        self._busy_since = 0.0
        self._counters = {"requests": 0.0, "generated_tokens": 0.0, "prompt_tokens": 0.0, "busy_s": 0.0}
        self._started = time.perf_counter()
        self.buckets_loaded = 0  # in the last streamed load
        self._interrupt = asyncio.Event()  # set by `interrupt`; replaced by a fresh one for later requests
        self._stopped: dict[str, tuple[list[int], float]] = {}  # key -> the rest of a stopped reply, and its time

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        if key in self._stopped:  # the rest of a reply an interrupt stopped, in the rest of its time
            ids, latency = self._stopped.pop(key)
        else:
            ids = self._rng.choice(self._replies)
            latency = self.latency_s() if callable(self.latency_s) else self.latency_s
        ids = ids[: params.max_new_tokens]
        if self._in_flight == 0:
            self._busy_since = time.perf_counter()
        self._in_flight += 1
        interrupt, started = self._interrupt, time.perf_counter()
        stopped = False
        try:
            if latency > 0:
                stopped = await _wait_or_timeout(interrupt, latency)
            else:
                await asyncio.sleep(0)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._counters["busy_s"] += time.perf_counter() - self._busy_since
        self._counters["requests"] += 1
        self._counters["generated_tokens"] += len(ids)
        self._counters["prompt_tokens"] += len(prompt_ids)
        finish = "stop" if ids and ids[-1] == self._replies[0][-1] else "length"
        if stopped:  # the tokens it would have sampled by now
            share = min(1.0, (time.perf_counter() - started) / latency)
            cut = int(len(ids) * share)
            if key:
                self._stopped[key] = (ids[cut:], latency * (1 - share))
            ids, finish = ids[:cut], "abort"
        return Generation(list(ids), [PLACEHOLDER_LOGPROB] * len(ids), finish, self.policy_version, len(prompt_ids))

    async def interrupt(self) -> None:
        self._interrupt.set()
        self._interrupt = asyncio.Event()

    def stats(self) -> dict[str, float]:
        out = dict(self._counters)
        if self._in_flight:
            out["busy_s"] += time.perf_counter() - self._busy_since
        out["uptime_s"] = time.perf_counter() - self._started
        return out

    async def load_weights(self, weights: Weights, version: int) -> None:
        """Drain the buckets on a thread (the producer may be slow), keep nothing, set the version."""
        if not isinstance(weights, Mapping):
            self.buckets_loaded = await asyncio.to_thread(_count_buckets, weights)
        self.policy_version = version

    async def sleep(self) -> None:
        return None

    async def wake(self) -> None:
        return None

    async def reset_prefix_cache(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def _wait_or_timeout(event: asyncio.Event, seconds: float) -> bool:
    """True if ``event`` was set within ``seconds``."""
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _count_buckets(weights: Weights) -> int:
    return sum(1 for _ in iter_buckets(weights))
