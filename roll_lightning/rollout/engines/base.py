"""The generation-engine interface and the types that cross it.

Each reply token carries its behaviour log-prob, ``log softmax(warp(logits))[token]``: ``warp`` divides by the
temperature (0 reads as 1) and masks what top-k / top-p exclude.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]
WeightBucket: TypeAlias = list[tuple[str, Any]]
Weights: TypeAlias = Mapping[str, Any] | Iterable[WeightBucket]
"""One mapping, or a once-iterable stream of ``(name, tensor)`` buckets (a bare pair is a bucket of one)."""


@dataclass(frozen=True)
class SamplingParams:
    """How one reply is sampled: temperature 0 is greedy, top_p 1 and top_k 0 are off; a reply keeps the token
    that stops it (eos, ``stop_token_ids``, or the one completing a ``stop`` string)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def replace(self, **changes: Any) -> SamplingParams:
        return SamplingParams(**{**self.__dict__, **changes})


@dataclass(frozen=True)
class Generation:
    """One sampled reply."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    prompt_tokens: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


class EngineClosed(RuntimeError):
    """The engine was closed, or its worker died (the cause is chained)."""


class Generates(Protocol):
    """Anything that samples a reply (an engine, or the scheduler's gate)."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation: ...


@runtime_checkable
class GenerationEngine(Protocol):
    """What the rollout needs from an engine."""

    policy_version: int
    concurrent_loads: bool  # may load while a sibling replica in this process does

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """``key`` names the conversation (a router keeps it on one replica)."""
        ...

    async def load_weights(self, weights: Weights, version: int) -> None:
        """Copy in new weights between generations; never keep the tensors (they may be the trainer's own)."""
        ...

    async def sleep(self) -> None:
        """Free accelerator memory for training (a no-op where unsupported)."""
        ...

    async def wake(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    def stats(self) -> dict[str, float]:
        """Counters since start: requests, generated_tokens, busy_s, ..."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that applies LoRA adapters itself (it is sent adapters, not merged weights)."""

    takes_adapters: bool

    async def load_adapter(self, tensors: Mapping[str, Any], config: Mapping[str, Any], version: int) -> None:
        """Load ``tensors`` (PEFT names) with their adapter ``config`` as ``version``."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    """An engine that can stop its replies in flight where they are (``on_suspend: keep``)."""

    async def interrupt(self) -> None:
        """Every reply in flight (or queued) now returns at once with the tokens it has, ``finish_reason="abort"``;
        replies asked after this call are not affected."""
        ...


def joined(segments: Sequence[Generation]) -> Generation:
    """One reply from the pieces several weight versions sampled: its tokens and log-probs in order,
    ``policy_version`` the oldest (a reply is as stale as its oldest token), ``extra["versions"]`` the
    ``[token offset, version]`` where each piece starts."""
    if len(segments) == 1:
        return segments[0]
    last = segments[-1]
    versions: list[list[int]] = []
    offset = 0
    for piece in segments:
        if piece.token_ids and (not versions or versions[-1][1] != piece.policy_version):
            versions.append([offset, piece.policy_version])
        offset += len(piece.token_ids)
    return Generation(
        token_ids=[t for piece in segments for t in piece.token_ids],
        logprobs=[lp for piece in segments for lp in piece.logprobs],
        finish_reason=last.finish_reason,
        policy_version=min(p.policy_version for p in segments if p.token_ids) if offset else last.policy_version,
        prompt_tokens=segments[0].prompt_tokens,
        extra={**last.extra, "versions": versions} if len(versions) > 1 else dict(last.extra),
    )


def stop_string_end(
    decode: Callable[[Sequence[int]], str], token_ids: Sequence[int], stop: Sequence[str]
) -> int | None:
    """The fewest leading ``token_ids`` whose text contains a stop string (None if none does)."""
    if not stop or not token_ids or not any(s in decode(token_ids) for s in stop):
        return None
    low, high = 1, len(token_ids)  # a longer prefix's text contains a shorter one's
    while low < high:
        mid = (low + high) // 2
        if any(s in decode(token_ids[:mid]) for s in stop):
            high = mid
        else:
            low = mid + 1
    return low


def mark_seen(call: Any) -> None:
    """Reads an abandoned call's outcome, so asyncio never logs "exception was never retrieved"."""
    if not call.cancelled():
        call.exception()


def iter_buckets(weights: Weights) -> Iterator[Sequence[tuple[str, Any]]]:
    """The buckets of ``weights`` (see `Weights`)."""
    if isinstance(weights, Mapping):
        yield list(weights.items())
        return
    for bucket in weights:
        if isinstance(bucket, Mapping):
            yield list(bucket.items())
        elif isinstance(bucket, tuple) and len(bucket) == 2 and isinstance(bucket[0], str):
            yield [bucket]
        else:
            yield bucket


def iter_weight_pairs(weights: Weights) -> Iterator[tuple[str, Any]]:
    for bucket in iter_buckets(weights):
        yield from bucket


class BucketFeed:
    """A one-slot channel of weight buckets from a producer thread to one consumer; each bucket is emptied once
    consumed, so at most one is alive."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._slot: WeightBucket | None = None  # offered, not yet taken
        self._held: WeightBucket | None = None  # taken by the consumer, not yet done
        self._closed = False
        self._stopped = False
        self._error: BaseException | None = None
        self._iterated = False
        self.offered = 0
        self.done = 0

    # -- producer ------------------------------------------------------------------------------------

    def put(self, bucket: Sequence[tuple[str, Any]], timeout: float | None = None) -> bool:
        """`offer`, then `wait_done`."""
        return self.offer(bucket) and self.wait_done(timeout)

    def offer(self, bucket: Sequence[tuple[str, Any]]) -> bool:
        """Hand ``bucket`` over; False if the consumer stopped."""
        with self._cond:
            if self._closed or self._error is not None:
                raise RuntimeError("BucketFeed: offer after close() or fail()")
            if self._slot is not None or self._held is not None:
                raise RuntimeError("BucketFeed: offer before the consumer was done with the previous bucket")
            if self._stopped:
                return False
            self._slot = list(bucket)
            self.offered += 1
            self._cond.notify_all()
            return True

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until the last offered bucket is consumed; False if the consumer stopped."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._stopped or self.done >= self.offered, timeout):
                raise TimeoutError(f"BucketFeed: the consumer did not finish a bucket within {timeout} s")
            return self.done >= self.offered

    def close(self) -> None:
        """No more buckets."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer failed: the consumer's next ``next()`` raises."""
        with self._cond:
            self._error = error
            self._slot = None
            self._cond.notify_all()

    # -- consumer ------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[WeightBucket]:
        with self._cond:
            if self._iterated:
                raise RuntimeError("BucketFeed: a feed can be iterated once")
            self._iterated = True
        return self

    def __next__(self) -> WeightBucket:
        with self._cond:
            self._release_held()
            self._cond.wait_for(lambda: self._slot is not None or self._closed or self._error is not None)
            if self._error is not None:
                raise RuntimeError(f"the weights stream failed: {self._error!r}") from self._error
            if self._slot is None:
                raise StopIteration
            self._held, self._slot = self._slot, None
            return self._held

    def stop(self) -> None:
        """The consumer is gone: the producer stops waiting on it."""
        with self._cond:
            self._stopped = True
            self._slot = None
            if self._held is not None:
                self._held.clear()
                self._held = None
            self._cond.notify_all()

    def _release_held(self) -> None:
        if self._held is not None:
            self._held.clear()  # drop every reference the feed handed out
            self._held = None
            self.done += 1
            self._cond.notify_all()
