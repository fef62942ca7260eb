"""One rollout batch of the tiny model through the real transformers engine, and what the trainer computes of its
rows from scratch (the check that rows carry the engine's tokens and log-probs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine


async def one_batch(pool: EnvPool, model_dir: Path, tokenizer: Any, cfg: RolloutConfig, seed: int = 1) -> Any:
    """One rollout batch from the tiny model through the transformers engine."""
    engine = TransformersEngine(model_dir, seed=seed)
    scheduler = RolloutScheduler(pool, engine, tokenizer, cfg)
    try:
        return await scheduler.get_batch()
    finally:
        await scheduler.close()
        await engine.close()


def recomputed_logprobs(model_dir: Path, batch: Any, temperature: float) -> torch.Tensor:
    """What the trainer computes: log softmax(logits / T) of each token, from one forward pass over each row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        ).logits
    logp = torch.log_softmax(logits[:, :-1] / temperature, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(logp, (1, 0))  # token-aligned, like behaviour_logprobs
