"""The whole rollout with the real tiny model and real env servers: rows the trainer can trust."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.tiny_rollout import one_batch, recomputed_logprobs

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.prompts.chat import PromptConfig


@pytest.mark.parametrize("layout", ["trajectory", "step"])
async def test_rows_carry_the_engine_tokens_and_log_probs_the_trainer_recomputes(
    pool: EnvPool, model_dir: Path, tokenizer: Any, layout: str
) -> None:
    temperature = 0.8
    episode = EpisodeSettings(
        layout=layout,  # type: ignore[arg-type]
        max_turns=3,
        max_context_tokens=1024,
        sampling=SamplingParams(max_new_tokens=12, temperature=temperature),
    )
    cfg = RolloutConfig(
        env_id="sokoban", env_config={"dim_room": [6, 6], "num_boxes": 1}, group_size=2, batch_size=4, episode=episode
    )
    batch = await one_batch(pool, model_dir, tokenizer, cfg)
    mask = batch.response_mask
    replies = sum(len(ep.turns) for ep in batch.episodes)  # response_tokens_mean is per reply
    assert int(mask.sum()) == round(batch.metrics["rollout/response_tokens_mean"] * replies)
    recomputed = recomputed_logprobs(model_dir, batch, temperature)
    gap = (recomputed - batch.behaviour_logprobs)[mask].abs()
    assert gap.max() < 1e-3, f"trainer vs engine log-prob gap {gap.max():.2e}"
    assert bool((batch.behaviour_logprobs[~mask] == 0).all())
    text = tokenizer.decode(batch.input_ids[0][batch.attention_mask[0].bool()], skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n") and "Sokoban" in text
    assert batch.position_ids[0, : int(batch.attention_mask[0].sum())].tolist() == list(
        range(int(batch.attention_mask[0].sum()))
    )
    if layout == "step":
        assert len(batch) == 4 * 3 and set(batch.step.tolist()) == {0, 1, 2}
        assert torch.equal(batch.step_scores, batch.scores.sum(-1))
    else:
        assert len(batch) == 4 and torch.allclose(batch.episode_scores, batch.scores.sum(-1))


@pytest.mark.parametrize("layout", ["trajectory", "step"])
async def test_a_reply_prefix_is_prompt_the_env_receives_and_stop_strings_end_replies(
    pool: EnvPool, model_dir: Path, tokenizer: Any, layout: str
) -> None:
    """``prompt.reply_prefix`` ends every prompt (not sampled, no log-prob, not trained on) and starts the action
    the env receives: a prefix that is itself a whole answer makes every random reply a valid move. ``sampling.stop``
    ends replies at the stop string, which the reply keeps; the trainer's log-probs still equal the engine's."""
    prefix, temperature = "<answer>Left</answer>", 1.0
    episode = EpisodeSettings(
        layout=layout,  # type: ignore[arg-type]
        max_turns=3,
        max_context_tokens=1024,
        sampling=SamplingParams(max_new_tokens=8, temperature=temperature, stop=("e",)),
        prompt=PromptConfig(reply_prefix=prefix),
    )
    cfg = RolloutConfig(
        env_id="frozenlake", env_config={"size": 4, "max_steps": 3}, group_size=2, batch_size=8, episode=episode
    )
    batch = await one_batch(pool, model_dir, tokenizer, cfg)
    turns = [t for ep in batch.episodes for t in ep.turns]
    assert all(t.action_valid for t in turns)  # the env parsed the prefix's answer out of every action
    assert all(t.reply.startswith(prefix) and t.reply_prefix == prefix for t in turns)
    assert all(tokenizer.decode(t.prompt_ids).endswith(prefix) for t in turns)  # the prompt ends with it
    assert all(prefix not in tokenizer.decode(t.response_ids) for t in turns)  # never sampled
    stopped = [t for t in turns if t.finish_reason == "stop" and t.response_ids[-1] != tokenizer.eos_token_id]
    assert stopped  # the reply ends with the token that completes the stop string, which it keeps
    assert all(
        "e" in tokenizer.decode(t.response_ids) and "e" not in tokenizer.decode(t.response_ids[:-1]) for t in stopped
    )
    mask = batch.response_mask
    assert int(mask.sum()) == sum(len(t.response_ids) for t in turns)  # the prefix is not a reply token
    gap = (recomputed_logprobs(model_dir, batch, temperature) - batch.behaviour_logprobs)[mask].abs()
    assert gap.max() < 1e-3, f"trainer vs engine log-prob gap {gap.max():.2e}"
    if layout == "trajectory":  # the next prompt holds the prefix and the reply exactly as the model saw them
        ep = batch.episodes[0]
        text = tokenizer.decode([i for t in ep.turns for i in t.prompt_ids + t.response_ids])
        for t in ep.turns:
            assert prefix + tokenizer.decode(t.response_ids) in text
