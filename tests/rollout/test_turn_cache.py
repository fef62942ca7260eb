"""Keys/values kept between a conversation's turns (`TurnCache`): the same replies as without, less prefill.

Each test plays the same conversations through two transformers engines on the same weights, one with the cache
and one without (``turn_cache_gib=0``: `model.generate` over the whole conversation every turn), and compares
them token for token (greedy) and log-prob for log-prob, across a weight load.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from roll_lightning.models.tiny import build_tiny_model
from roll_lightning.rollout.engines import Generation, SamplingParams
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.engines.turn_cache import TurnCache, TurnKV

GREEDY = SamplingParams(max_new_tokens=6, temperature=0)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


async def _conversation(
    engine: TransformersEngine, tokenizer: Any, key: str, turns: int, params: SamplingParams = GREEDY
) -> list[Generation]:
    """``turns`` turns of one conversation: each prompt is the last one + its reply + a new observation."""
    prompt = _encode(tokenizer, f"<|im_start|>user\nboard {key} {'#' * len(key)}<|im_end|>\n<|im_start|>assistant\n")
    replies = []
    for turn in range(turns):
        reply = await engine.generate(prompt, params, key=key)
        replies.append(reply)
        prompt = [*prompt, *reply.token_ids, *_encode(tokenizer, f"\nobservation {turn}: {key * (turn + 1)}\n")]
    return replies


async def _play(engine: TransformersEngine, tokenizer: Any, turns: dict[str, int], **kw: Any) -> dict[str, Any]:
    """Conversations of different lengths at once, so cached and new lengths differ within a batch."""
    keys = list(turns)
    played = await asyncio.gather(*(_conversation(engine, tokenizer, k, turns[k], **kw) for k in keys))
    return dict(zip(keys, played, strict=True))


def _assert_same(cached: dict[str, list[Generation]], plain: dict[str, list[Generation]]) -> None:
    for key in plain:
        for a, b in zip(cached[key], plain[key], strict=True):
            assert a.token_ids == b.token_ids, key
            assert a.finish_reason == b.finish_reason
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=["bpe", "words", "learned"])
def arch_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2 (bpe), Llama (words) and GPT-2 (learned positions)."""
    positions = "learned" if request.param == "learned" else "rotary"
    vocab = "bpe" if request.param == "bpe" else "words"
    return build_tiny_model(tmp_path_factory.mktemp(request.param), vocab=vocab, positions=positions)


async def test_greedy_replies_and_logprobs_equal_without_the_cache_across_a_weight_load(arch_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(arch_dir)
    cached, plain = TransformersEngine(arch_dir, turn_cache_gib=1), TransformersEngine(arch_dir, turn_cache_gib=0)
    turns = {"a": 4, "bb": 2, "ccc": 5}
    try:
        before = [await _play(engine, tokenizer, turns) for engine in (cached, plain)]
        stats = cached.stats()
        assert stats["turn_cache_reused_tokens"] > stats["turn_cache_prefilled_tokens"] > 0
        assert len(cached.turn_cache) == 3 and plain.stats()["turn_cache_reused_tokens"] == 0

        other = AutoModelForCausalLM.from_pretrained(arch_dir, dtype=torch.float32)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        weights = {k: v.clone() for k, v in other.state_dict().items()}
        for engine in (cached, plain):
            await engine.load_weights(weights, version=1)
        assert len(cached.turn_cache) == 0  # the old weights' keys/values are gone
        reused = cached.stats()["turn_cache_reused_tokens"]
        after = [await _play(engine, tokenizer, turns) for engine in (cached, plain)]
    finally:
        await cached.close()
        await plain.close()
    _assert_same(*before)
    _assert_same(*after)
    assert [g.policy_version for g in after[0]["a"]] == [1] * 4
    assert cached.stats()["turn_cache_reused_tokens"] > reused
    assert any(a.token_ids != b.token_ids for a, b in zip(before[1]["ccc"], after[1]["ccc"], strict=True))


async def test_sampled_logprobs_are_the_distribution_sampled_from(model_dir: Path, tokenizer: Any) -> None:
    """Sampling from cached keys/values: each token's log-prob is the warped distribution's over the whole
    conversation, computed afresh."""
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_k=20)
    engine = TransformersEngine(model_dir, seed=5)
    try:
        replies = await _conversation(engine, tokenizer, "zz", 4, params)
        prompt_lengths = [g.prompt_tokens for g in replies]
        assert engine.stats()["turn_cache_reused_tokens"] > 0
    finally:
        await engine.close()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    last, reply = replies[-1], replies[-1].token_ids
    full = await _rebuild(tokenizer, replies)
    with torch.no_grad():
        logits = model(torch.tensor([full + reply])).logits[0, len(full) - 1 : -1] / 0.7
    kth = logits.topk(20, dim=-1).values[:, -1:]
    expected = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
    expected = expected.gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)
    assert len(full) == prompt_lengths[-1]
    torch.testing.assert_close(torch.tensor(last.logprobs), expected, atol=1e-4, rtol=1e-4)


async def _rebuild(tokenizer: Any, replies: list[Generation]) -> list[int]:
    """The last turn's prompt, rebuilt as `_conversation` built it."""
    key = "zz"
    prompt = _encode(tokenizer, f"<|im_start|>user\nboard {key} {'#' * len(key)}<|im_end|>\n<|im_start|>assistant\n")
    for turn, reply in enumerate(replies[:-1]):
        prompt = [*prompt, *reply.token_ids, *_encode(tokenizer, f"\nobservation {turn}: {key * (turn + 1)}\n")]
    return prompt


async def test_a_rewritten_history_reuses_only_the_shared_prefix(model_dir: Path, tokenizer: Any) -> None:
    cached, plain = TransformersEngine(model_dir), TransformersEngine(model_dir, turn_cache_gib=0)
    first = _encode(tokenizer, "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n")
    rewritten = _encode(tokenizer, "<|im_start|>user\nhello world, again<|im_end|>\n<|im_start|>assistant\n")
    shared = next(i for i, (a, b) in enumerate(zip(first, rewritten, strict=False)) if a != b)
    try:
        await cached.generate(first, GREEDY, key="k")
        base = cached.stats()["turn_cache_reused_tokens"]
        got = await cached.generate(rewritten, GREEDY, key="k")
        want = await plain.generate(rewritten, GREEDY, key="k")
    finally:
        await cached.close()
        await plain.close()
    assert cached.stats()["turn_cache_reused_tokens"] - base == shared
    assert got.token_ids == want.token_ids


def _entry(tokens: int, version: int = 0) -> TurnKV:
    kv = torch.zeros((1, tokens, 256))  # 1 KiB per token, keys and values alike
    return TurnKV(list(range(tokens)), [(kv, kv.clone())], version)


def test_the_cache_is_bounded_in_bytes_and_evicts_the_least_recently_used() -> None:
    cache = TurnCache(gib=8 * 2048 / (1 << 30))  # room for 8 tokens' keys and values
    cache.put("a", _entry(3))
    cache.put("b", _entry(3))
    assert len(cache) == 2 and cache.nbytes == 6 * 2048
    entry, reused = cache.take("a", [0, 1, 2, 9], version=0)  # "a" used: it leaves, and comes back as the newest
    assert entry is not None and reused == 3
    cache.put("a", _entry(4))
    cache.put("c", _entry(2))  # 3 + 4 + 2 > 8: "b", the least recently used, goes
    assert cache.take("b", [0, 1, 2, 3], version=0) == (None, 0)
    assert cache.counters["evictions"] == 1 and cache.nbytes == 6 * 2048
    cache.put("huge", _entry(9))  # larger than the whole cache: kept nowhere
    assert len(cache) == 2
    assert cache.take("a", [0, 1, 2, 3, 4], version=1) == (None, 0)  # another policy version's keys/values
    assert cache.take("c", [0], version=0) == (None, 0)  # a one-token prompt needs its own logits


def test_a_vision_language_model_generates_without_the_cache(tmp_path: Path) -> None:
    """Its positions follow the pictures (M-RoPE): `model.generate` places them, so the engine keeps no cache."""
    from transformers import AutoModelForImageTextToText

    from roll_lightning.models.tiny_vl import tiny_vl_model
    from roll_lightning.rollout.engines.cached_decode import supports_turn_cache

    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model(tmp_path, seed=0))
    assert not supports_turn_cache(model)
