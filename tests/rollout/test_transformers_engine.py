"""The transformers engine with the tiny model: log-prob convention, stopping, batching, weight loads, replicas."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from roll_lightning.rollout.engines import EngineClosed, EngineRouter, SamplingParams
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine


def _prompt(tokenizer: Any, text: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


def _teacher_forced_logprobs(
    model_dir: Path, prompt: list[int], reply: list[int], temperature: float, top_k: int = 0
) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, 0), (0.7, 0), (0.7, 20)])
async def test_logprobs_are_those_of_the_distribution_sampled_from(
    model_dir: Path, tokenizer: Any, temperature: float, top_k: int
) -> None:
    """Temperature-scaled; with top-k on, renormalised over the k kept tokens."""
    engine = TransformersEngine(model_dir, seed=3)
    try:
        prompt = _prompt(tokenizer, "#####\n#P_O#\n#####")
        gen = await engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=temperature, top_k=top_k))
    finally:
        await engine.close()
    assert 1 <= len(gen.token_ids) <= 12 and len(gen.logprobs) == len(gen.token_ids)
    expected = _teacher_forced_logprobs(model_dir, prompt, gen.token_ids, temperature, top_k)
    torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=1e-4, rtol=1e-4)


async def test_length_limit_and_stop_token(model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir)
    prompt = _prompt(tokenizer, "hello")
    try:
        cut = await engine.generate(prompt, SamplingParams(max_new_tokens=3, temperature=0))
        assert len(cut.token_ids) <= 3
        # Make the greedy continuation's first token a stop token: the reply is that one token, finish "stop".
        first = cut.token_ids[0]
        stopped = await engine.generate(
            prompt, SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(first,))
        )
    finally:
        await engine.close()
    assert cut.finish_reason == ("stop" if cut.token_ids[-1] == tokenizer.eos_token_id else "length")
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop"


async def test_concurrent_requests_share_batches_and_match_solo_greedy(model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir)
    prompts = [_prompt(tokenizer, f"board {i} " * (1 + i % 3)) for i in range(8)]
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    try:
        solo = [await engine.generate(p, greedy) for p in prompts]
        batches_before = engine._batches
        together = await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
        batches = engine._batches - batches_before
    finally:
        await engine.close()
    assert batches < len(prompts)  # concurrent calls were batched
    assert [g.token_ids for g in together] == [g.token_ids for g in solo]  # left padding changes nothing
    assert engine.stats()["requests"] == 16


async def test_requests_that_differ_only_in_their_budget_share_batches_each_stopping_at_its_own(
    model_dir: Path, tokenizer: Any
) -> None:
    """A kept reply's continuation asks for what is left of its budget: it still batches with the others, and each
    row ends at its own ``max_new_tokens`` with the tokens and log-probs it would have had alone."""
    engine = TransformersEngine(model_dir)
    prompts = [_prompt(tokenizer, f"board {i} " * (1 + i % 3)) for i in range(3)]
    budgets = [3, 9, 6]
    asks = [SamplingParams(max_new_tokens=n, temperature=0, stop_token_ids=()) for n in budgets]
    engine._suppressed = [*(engine._suppressed or []), *engine.eos_ids]  # no reply ends before its budget
    try:
        solo = [await engine.generate(p, a) for p, a in zip(prompts, asks, strict=True)]
        batches_before = engine._batches
        await engine.run_on_worker(lambda: None)  # the worker idle: the three calls below arrive together
        together = await asyncio.gather(*(engine.generate(p, a) for p, a in zip(prompts, asks, strict=True)))
        batches = engine._batches - batches_before
    finally:
        await engine.close()
    assert batches < 3
    assert [len(g.token_ids) for g in together] == budgets and {g.finish_reason for g in together} == {"length"}
    assert [g.token_ids for g in together] == [g.token_ids for g in solo]
    for alone, batched in zip(solo, together, strict=True):
        torch.testing.assert_close(torch.tensor(batched.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0)


async def test_a_batch_of_replies_wakes_the_event_loop_once_not_once_per_reply(
    model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight replies of one length, asked together, come back in fewer wake-ups of the caller's loop than replies
    (`ThreadedEngine._hand_over`), each the same as asked alone. The spy counts, it changes nothing."""
    engine = TransformersEngine(model_dir)
    prompts = [_prompt(tokenizer, f"board {i} " * (1 + i % 3)) for i in range(8)]
    ask = SamplingParams(max_new_tokens=4, temperature=0, stop_token_ids=())
    engine._suppressed = [*(engine._suppressed or []), *engine.eos_ids]  # every reply is 4 tokens
    loop = asyncio.get_running_loop()
    wakes: list[Any] = []
    try:
        solo = [await engine.generate(p, ask) for p in prompts]
        await engine.run_on_worker(lambda: None)  # the worker idle: the eight calls below arrive together
        call_soon_threadsafe = loop.call_soon_threadsafe
        monkeypatch.setattr(
            loop, "call_soon_threadsafe", lambda *a, **k: wakes.append(a) or call_soon_threadsafe(*a, **k)
        )
        together = await asyncio.gather(*(engine.generate(p, ask) for p in prompts))
        monkeypatch.undo()
    finally:
        await engine.close()
    assert [g.token_ids for g in together] == [g.token_ids for g in solo]
    assert 1 <= len(wakes) < len(prompts)


async def test_load_weights_makes_the_engine_generate_with_the_new_model(
    model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    prompt = _prompt(tokenizer, "#P_X_O#")
    greedy = SamplingParams(max_new_tokens=10, temperature=0)
    engine, reference = TransformersEngine(model_dir), TransformersEngine(model_dir_seed1)
    try:
        before = await engine.generate(prompt, greedy)
        new_weights = AutoModelForCausalLM.from_pretrained(model_dir_seed1).state_dict()
        await engine.load_weights(new_weights, version=7)
        after = await engine.generate(prompt, greedy)
        expected = await reference.generate(prompt, greedy)
    finally:
        await asyncio.gather(engine.close(), reference.close())
    assert after.token_ids == expected.token_ids and after.policy_version == 7
    assert before.token_ids != after.token_ids and before.policy_version == 0
    torch.testing.assert_close(torch.tensor(after.logprobs), torch.tensor(expected.logprobs))


async def test_a_bad_state_dict_is_refused_and_the_engine_keeps_working(model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir)
    try:
        with pytest.raises(ValueError, match="missing"):
            await engine.load_weights({"model.embed_tokens.weight": torch.zeros(1)}, version=1)
    except RuntimeError:  # a shape mismatch is reported by torch before the key check
        pass
    try:
        gen = await engine.generate(_prompt(tokenizer, "x"), SamplingParams(max_new_tokens=2, temperature=0))
        assert gen.policy_version == 0 and gen.token_ids
    finally:
        await engine.close()
    with pytest.raises(EngineClosed):
        await engine.generate([1, 2], SamplingParams())


async def test_a_failing_batch_fails_its_callers_and_the_engine_lives_on(model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir)
    try:
        with pytest.raises(ValueError, match="token ids"):
            await engine.generate({"input_ids": [1, 2]}, SamplingParams())  # type: ignore[arg-type]
        with pytest.raises(IndexError):
            await engine.generate([10_000_000], SamplingParams(max_new_tokens=2))  # id beyond the vocabulary
        gen = await engine.generate(_prompt(tokenizer, "x"), SamplingParams(max_new_tokens=2, temperature=0))
    finally:
        await engine.close()
    assert gen.token_ids


async def test_cancelled_requests_are_not_computed(model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir, max_batch_size=4)
    params = SamplingParams(max_new_tokens=8)
    try:
        calls = [asyncio.create_task(engine.generate(_prompt(tokenizer, f"x{i}"), params)) for i in range(32)]
        await asyncio.sleep(0.01)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await engine.generate(_prompt(tokenizer, "after"), SamplingParams(max_new_tokens=1))
    finally:
        await engine.close()
    assert engine.stats()["requests"] < 10  # at most the batch already running when the callers gave up, + 1


async def test_router_keeps_a_conversation_on_one_replica_and_balances_new_ones(
    model_dir: Path, tokenizer: Any
) -> None:
    router = EngineRouter([TransformersEngine(model_dir), TransformersEngine(model_dir)])
    greedy = SamplingParams(max_new_tokens=2, temperature=0)
    prompt = _prompt(tokenizer, "go")
    try:
        for _turn in range(3):
            await asyncio.gather(*(router.generate(prompt, greedy, key=f"episode-{i}") for i in range(6)))
        routes = {f"episode-{i}": router.replica_for(f"episode-{i}") for i in range(6)}
        per_replica = [r.stats()["requests"] for r in router.replicas]
        router.release("episode-0")
        await router.load_weights(router.replicas[0].model.state_dict(), version=2)
    finally:
        await router.close()
    assert sorted(routes.values()).count(0) == 3 and sorted(routes.values()).count(1) == 3
    assert per_replica == [9.0, 9.0]  # 3 episodes x 3 turns each, never moved
    assert router.policy_version == 2


async def test_stop_strings_end_each_reply_at_the_token_that_completes_them(model_dir: Path, tokenizer: Any) -> None:
    """In a batch where rows stop at different points: each reply is the greedy reply cut at the first token whose
    text completes the stop string (kept), with its log-probs; a row without it runs to its length."""
    from support.stops import stop_inside

    from roll_lightning.rollout.engines.base import stop_string_end

    engine = TransformersEngine(model_dir)
    prompts = [_prompt(tokenizer, f"board {i}: #P_X_O#") for i in range(4)]
    greedy = SamplingParams(max_new_tokens=24, temperature=0)
    try:
        full = [await engine.generate(p, greedy) for p in prompts]
        stop = stop_inside(tokenizer, full[0].token_ids)
        stopped = await asyncio.gather(*(engine.generate(p, greedy.replace(stop=(stop,))) for p in prompts))
    finally:
        await engine.close()
    decode = tokenizer.decode
    for whole, cut in zip(full, stopped, strict=True):
        end = stop_string_end(decode, whole.token_ids, [stop])
        if end is None:
            assert cut.token_ids == whole.token_ids and cut.finish_reason == whole.finish_reason
            continue
        assert cut.token_ids == whole.token_ids[:end] and cut.finish_reason == "stop"
        assert stop in decode(cut.token_ids) and stop not in decode(cut.token_ids[:-1])
        torch.testing.assert_close(torch.tensor(cut.logprobs), torch.tensor(whole.logprobs[:end]))
    assert stopped[0].finish_reason == "stop"


def test_stop_string_end_is_the_fewest_tokens_whose_text_holds_a_stop() -> None:
    from roll_lightning.rollout.engines.base import stop_string_end

    pieces = {1: "<ans", 2: "wer>", 3: "Left", 4: "</", 5: "answer", 6: ">\n", 7: "more"}
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    ids = [1, 2, 3, 4, 5, 6, 7]
    assert stop_string_end(decode, ids, ["</answer>"]) == 6  # completed inside ">\n": that token is kept
    assert stop_string_end(decode, ids, ["Le", "</answer>"]) == 3  # the earliest of several
    assert stop_string_end(decode, ids, ["<answer>"]) == 2  # across a token boundary
    assert stop_string_end(decode, ids, ["nowhere"]) is None
    assert stop_string_end(decode, [], ["x"]) is None and stop_string_end(decode, ids, []) is None
    with pytest.raises(ValueError, match="stop must be a list of non-empty strings"):
        SamplingParams(stop="</answer>")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        SamplingParams(stop=("",))
