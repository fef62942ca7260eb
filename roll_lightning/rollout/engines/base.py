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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """How one reply is sampled.

    Args:
        max_new_tokens: the reply's token budget (the episode runner lowers it to fit the context budget).
        temperature: 0 = greedy.
        top_p: nucleus sampling (1.0 = off).
        top_k: 0 = off.
        stop_token_ids: extra ids that end a reply (the tokenizer's eos always does); the stop token is kept.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
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


@runtime_checkable
class GenerationEngine(Protocol):
    """What the rollout needs from an engine. Implementations: `TransformersEngine`, `VLLMEngine`,
    `EngineRouter` (several replicas behind one engine), `SimulatedEngine` (scheduling tests and benchmarks)."""

    policy_version: int

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """Sample one reply. ``key`` names the conversation (a router keeps one key on one replica)."""
        ...

    async def load_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        """Replace the weights (between generations, never under one) and set ``policy_version``."""
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
