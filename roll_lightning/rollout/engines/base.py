"""The generation-engine interface the rollout talks to, and the types that cross it.

An engine turns a prompt (token ids) into a reply (token ids) and reports, for every reply token, the log-prob
the sampling policy gave it. Those log-probs are the *behaviour policy* of PPO: they must describe the
distribution the token was actually drawn from, so the convention is fixed here for every engine:

    logprob_t = log softmax(warp(logits_t))[token_t]

where ``warp`` divides by the temperature (0 is read as 1) and, when top-k / top-p are on, masks the tokens
they exclude (the distribution is renormalised over what is left). With top-k and top-p off, the usual RL
setting, that is exactly the trainer's ``log softmax(logits / temperature)``. Engines run their compute off the
asyncio loop; `generate` is a coroutine so hundreds of episodes can wait on it concurrently, and the engine
batches what is waiting.

Weights reach an engine through `load_weights` as a full ``{name: tensor}`` mapping, or streamed: an iterable of
*buckets*, each a list of ``(name, tensor)`` pairs (`Weights`). A streamed load holds one bucket at a time, so
no second full copy of the model exists; `BucketFeed` hands buckets from the thread that makes them (the
trainer, gathering its parameters) to the engine's worker thread that copies them into the engine's own tensors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]
WeightBucket: TypeAlias = list[tuple[str, Any]]
Weights: TypeAlias = Mapping[str, Any] | Iterable[WeightBucket]
"""What `GenerationEngine.load_weights` takes: every weight as one mapping, or an iterable (typically a
`BucketFeed`, which can be iterated once) of buckets of ``(name, tensor)`` pairs; a bare ``(name, tensor)`` pair
in place of a bucket is read as a bucket of one."""


@dataclass(frozen=True)
class SamplingParams:
    """How one reply is sampled.

    Args:
        max_new_tokens: the reply's token budget (the episode runner lowers it to fit the context budget).
        temperature: 0 = greedy.
        top_p: nucleus sampling (1.0 = off).
        top_k: 0 = off.
        stop_token_ids: extra ids that end a reply (the tokenizer's eos always does); the stop token is kept.
        stop: strings that end a reply, e.g. ``["</answer>"]``. The reply ends with the token that completes the
            first stop string and keeps it (that token may carry a few characters past the string): the reply the
            env receives and the conversation's next prompt hold exactly the tokens the model sampled.
    """

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
    """One reply: the exact ids the engine sampled (never re-tokenised), their behaviour log-probs, why it
    stopped, and the policy version of the weights that produced it."""

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
    """`generate` on an engine that was closed (or whose worker died; the cause is chained)."""


class Generates(Protocol):
    """What plays a turn: anything that samples a reply, an engine or the scheduler's suspend/resume gate."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation: ...


@runtime_checkable
class GenerationEngine(Protocol):
    """What the rollout needs from an engine. Implementations: `TransformersEngine`, `VLLMEngine`,
    `EngineRouter` (several replicas behind one engine), `SimulatedEngine` (scheduling tests and benchmarks)."""

    policy_version: int
    concurrent_loads: bool  # may load weights while a sibling replica in this process does (see `EngineRouter`)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """Sample one reply. ``key`` names the conversation (a router keeps one key on one replica)."""
        ...

    async def load_weights(self, weights: Weights, version: int) -> None:
        """Replace the weights (between generations, never under one) and set ``policy_version``.

        ``weights``: a full mapping, or buckets (`Weights`), consumed once, in order, one bucket at a time; each
        tensor is copied into the engine's own storage (the engine never keeps the caller's tensors, which may be
        the trainer's live parameters)."""
        ...

    async def sleep(self) -> None:
        """Free accelerator memory for training (a no-op where unsupported)."""
        ...

    async def wake(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    def stats(self) -> dict[str, float]:
        """Counters since start: requests, generated_tokens, busy_s (seconds computing), ..."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that applies LoRA adapters itself (`VLLMEngine` built with ``max_lora_rank > 0``): `WeightSync`
    sends it the adapters alone instead of the merged weights. ``takes_adapters`` is False when it was built
    without LoRA. A router of replicas is not one (its replicas get merged weights)."""

    takes_adapters: bool

    async def load_adapter(self, tensors: Mapping[str, Any], config: Mapping[str, Any], version: int) -> None:
        """Load the adapters (``tensors`` in PEFT's names, ``config`` its adapter config) as ``version``."""
        ...


def stop_string_end(
    decode: Callable[[Sequence[int]], str], token_ids: Sequence[int], stop: Sequence[str]
) -> int | None:
    """How many of ``token_ids`` a reply keeps when it ends at a stop string: the fewest leading tokens whose text
    contains one of ``stop`` (None when no stop string occurs). ``decode`` turns ids into text."""
    if not stop or not token_ids or not any(s in decode(token_ids) for s in stop):
        return None
    low, high = 1, len(token_ids)  # the text of a longer prefix contains that of a shorter one
    while low < high:
        mid = (low + high) // 2
        if any(s in decode(token_ids[:mid]) for s in stop):
            high = mid
        else:
            low = mid + 1
    return low


def mark_seen(call: Any) -> None:
    """A done-callback for an engine call whose caller may be gone (cancelled by a suspend or a shrink, or
    abandoned): reads its outcome so asyncio never reports "exception was never retrieved"."""
    if not call.cancelled():
        call.exception()


def iter_buckets(weights: Weights) -> Iterator[Sequence[tuple[str, Any]]]:
    """The buckets of ``weights``: a mapping is one bucket (its items); a mapping inside the stream is read as its
    items, and a bare ``(name, tensor)`` pair as a bucket of one."""
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
    """Every ``(name, tensor)`` pair of ``weights``, bucket after bucket (what vLLM's loaders iterate)."""
    for bucket in iter_buckets(weights):
        yield from bucket


class BucketFeed:
    """A one-slot channel of weight buckets from a producer thread to the one consumer that iterates it (an engine
    loading its weights on its worker thread).

    `put` returns once the consumer is *done* with the bucket (it asked for the next one, or stopped), and the
    feed then empties the bucket's list, so no reference to its tensors is left with the feed or the consumer:
    the producer makes the next bucket only after the last one was loaded, and at most one bucket is alive. The
    producer ends the stream with `close` (the consumer's iteration stops) or `fail` (the consumer's next
    ``next()`` raises). The consumer's side calls `stop` when it has finished, in success or error, so a producer
    never waits on a consumer that is gone: `put` then returns False at once.
    """

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
        """Hand ``bucket`` over and wait until the consumer is done with it; False if the consumer stopped first."""
        return self.offer(bucket) and self.wait_done(timeout)

    def offer(self, bucket: Sequence[tuple[str, Any]]) -> bool:
        """Hand ``bucket`` over without waiting (the previous one must be done); False if the consumer stopped."""
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
        """Wait until the consumer is done with the last offered bucket; False if it stopped before that."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._stopped or self.done >= self.offered, timeout):
                raise TimeoutError(f"BucketFeed: the consumer did not finish a bucket within {timeout} s")
            return self.done >= self.offered

    def close(self) -> None:
        """No more buckets: the consumer's iteration ends after the last one."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """The producer failed: the consumer's next ``next()`` raises (its load is abandoned)."""
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
        """The consumer is gone (its load returned or raised): the producer stops waiting on it."""
        with self._cond:
            self._stopped = True
            self._slot = None
            if self._held is not None:
                self._held.clear()
                self._held = None
            self._cond.notify_all()

    def _release_held(self) -> None:
        if self._held is not None:
            self._held.clear()  # the tensors are loaded: drop every reference the feed handed out
            self._held = None
            self.done += 1
            self._cond.notify_all()
