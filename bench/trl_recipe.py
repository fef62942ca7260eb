"""The TRL side's recipe and episode player (`bench/trl_frozenlake.py`): our YAML recipe read as TRL settings,
and lock-step FrozenLake episodes in TRL's multi-turn form.

`Recipe.from_config` reads the settings both sides share from one of our configs (``configs/frozenlake_learn.yaml``
for the tiny model, ``configs/frozenlake_llm.yaml`` for SmolLM2), so the two sides cannot drift apart.
`play_episodes` plays one episode per board seed, every live episode's turn in one batch: a bare forward pass and
one sampled token when the recipe's replies are one token (the tiny model), TRL's own generation path
(`model.generate`) otherwise, with the recipe's reply prefix and stop strings.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from roll_lightning.env_client import EnvSession
from roll_lightning.rollout.engines.base import stop_string_end
from roll_lightning.rollout.prompts.chat import TokenHistory

CLIP = 0.2  # the ppo loss's default clip_low / clip_high (neither recipe sets them)


@dataclass(frozen=True)
class Recipe:
    """What the TRL side takes from one of our configs (the keys are named beside each field)."""

    config: Path
    model: str  # model.model
    dtype: str  # model.dtype: bfloat16 = autocast over float32 weights on both sides
    env_id: str  # data.rollout.env_id
    env_config: dict[str, Any]  # data.rollout.env_config
    group_size: int  # data.rollout.group_size
    batch_episodes: int  # data.rollout.batch_size
    mini_batches: int  # model.algorithm.mini_batches: optimiser steps per batch
    micro_episodes: int  # episodes per forward+backward (TRL's per_device_train_batch_size)
    lr: float  # model.optim.lr
    norm_by_std: bool  # model.algorithm.norm_by_std: GRPO's advantage divided by the group std
    temperature: float  # data.rollout.episode.sampling.temperature (the held-out play's too)
    max_new_tokens: int  # data.rollout.episode.sampling.max_new_tokens
    stop: tuple[str, ...]  # data.rollout.episode.sampling.stop
    max_turns: int  # data.rollout.episode.max_turns
    system_prompt: str  # data.rollout.episode.prompt.system_prompt
    reply_prefix: str  # data.rollout.episode.prompt.reply_prefix
    eval_episodes: int  # data.evaluation.episodes
    max_context_tokens: int  # trajectory rows: the whole episode must fit (the configs' value is for step rows)

    @classmethod
    def from_config(cls, path: str | Path, max_context_tokens: int, micro_episodes: int | None = None) -> Recipe:
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        model, rollout = cfg["model"], cfg["data"]["rollout"]
        episode, algorithm = rollout["episode"], model["algorithm"]
        sampling, prompt = episode.get("sampling", {}), episode.get("prompt", {})
        if prompt.get("turn_template", "{observation}") != "{observation}" or prompt.get("instruction_first_turn"):
            raise ValueError(f"{path}: the TRL side sends the observation alone as the user turn")
        mini = algorithm.get("mini_batches", 1)
        return cls(
            config=Path(path), model=model["model"], dtype=model.get("dtype", "float32"),
            env_id=rollout["env_id"], env_config=dict(rollout.get("env_config", {})),
            group_size=rollout["group_size"], batch_episodes=rollout["batch_size"], mini_batches=mini,
            micro_episodes=micro_episodes or rollout["batch_size"] // mini, lr=model["optim"]["lr"],
            norm_by_std=algorithm.get("norm_by_std", True), temperature=sampling.get("temperature", 1.0),
            max_new_tokens=sampling.get("max_new_tokens", 64), stop=tuple(sampling.get("stop", ())),
            max_turns=episode["max_turns"], system_prompt=prompt.get("system_prompt", ""),
            reply_prefix=prompt.get("reply_prefix", ""), eval_episodes=cfg["data"]["evaluation"]["episodes"],
            max_context_tokens=max_context_tokens,
        )  # fmt: skip

    @property
    def one_token(self) -> bool:
        return self.max_new_tokens == 1 and not self.stop

    def autocast(self) -> Any:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.dtype == "bfloat16")


@dataclass
class EpisodeResult:
    seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: a sampled token, 0: the env's (and the reply prefix)
    logprobs: list[float] = field(default_factory=list)  # the sampled tokens' log-probs, 0.0 on the env's
    ret: float = 0.0
    success: bool = False
    turns: int = 0
    invalid: int = 0


@dataclass
class PlayTimes:
    gen_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0


@torch.no_grad()
def play_episodes(
    model: Any,
    tokenizer: Any,
    recipe: Recipe,
    sessions: list[EnvSession],
    seeds: list[int],
    run: Any,
    *,
    generator: torch.Generator,
) -> tuple[list[EpisodeResult], PlayTimes]:
    """Play one episode per seed in lock-step (one batched generation per turn, one concurrent env step per turn).

    ``run(coro)`` runs a coroutine on the env loop and returns its result. Each turn's context is the episode's
    whole conversation so far, rendered by our `TokenHistory` (the system prompt, ChatML, the reply prefix, the
    reply ids appended as sampled), so every token id matches what our trainer builds on trajectory rows.
    """
    times = PlayTimes()
    started = time.perf_counter()
    stop_ids = {tokenizer.eos_token_id}
    t0 = time.perf_counter()
    resets = run(_gather([s.reset(seed=seed) for s, seed in zip(sessions, seeds, strict=False)]))
    times.env_s += time.perf_counter() - t0
    system = [{"role": "system", "content": recipe.system_prompt}] if recipe.system_prompt else []
    histories = [TokenHistory(tokenizer, messages=list(system)) for _ in seeds]
    results = [
        EpisodeResult(seed, list(history.add_user(reset.observation, recipe.reply_prefix)))
        for seed, history, reset in zip(seeds, histories, resets, strict=True)
    ]
    active = list(range(len(seeds)))
    for _turn in range(recipe.max_turns):
        active = [i for i in active if len(histories[i].ids) < recipe.max_context_tokens]  # our "context" end
        if not active:
            break
        t0 = time.perf_counter()
        with recipe.autocast():
            sample = _one_token if recipe.one_token else _generate
            replies = sample(model, tokenizer, recipe, [histories[i].ids for i in active], generator)
        actions = []
        for i, (ids, logprobs) in zip(active, replies, strict=True):
            histories[i].add_reply(ids, stop_ids, recipe.reply_prefix)
            results[i].completion_ids += ids
            results[i].env_mask += [1] * len(ids)
            results[i].logprobs += logprobs
            actions.append(recipe.reply_prefix + tokenizer.decode(ids, skip_special_tokens=True))  # as our runner
        times.gen_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        outcomes = run(_gather([sessions[i].step(a) for i, a in zip(active, actions, strict=True)]))
        times.env_s += time.perf_counter() - t0
        still = []
        for i, out in zip(active, outcomes, strict=True):
            result = results[i]
            result.ret += out.reward
            result.turns += 1
            result.invalid += not out.action_valid
            if out.done:
                result.success = out.metrics.get("success", 0.0) > 0  # the env's flag: the player is on G
                continue
            if result.turns < recipe.max_turns:  # the next turn's prompt delta belongs to the completion (mask 0)
                delta = list(histories[i].add_user(out.observation, recipe.reply_prefix))
                result.completion_ids += delta
                result.env_mask += [0] * len(delta)
                result.logprobs += [0.0] * len(delta)
            still.append(i)
        active = still
    times.total_s = time.perf_counter() - started
    return results, times


def _one_token(
    model: Any, tokenizer: Any, recipe: Recipe, contexts: list[list[int]], generator: torch.Generator
) -> list[tuple[list[int], list[float]]]:
    """One token per context from a bare forward pass: the same distribution as ``generate(max_new_tokens=1,
    top_k=0, top_p=1)``, without generate's per-call set-up."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(c) for c in contexts])
    input_ids = torch.full((len(contexts), int(lengths.max())), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, ids in enumerate(contexts):  # right padding: causal attention keeps the real positions exact
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
    logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
    last = logits[torch.arange(len(contexts)), (lengths - 1).to(device)].float().cpu() / recipe.temperature
    logp = torch.log_softmax(last, dim=-1)
    tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
    chosen = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return [([int(t)], [float(lp)]) for t, lp in zip(tokens, chosen, strict=True)]


def _generate(
    model: Any, tokenizer: Any, recipe: Recipe, contexts: list[list[int]], generator: torch.Generator
) -> list[tuple[list[int], list[float]]]:
    """TRL's own generation path without vLLM (`model.generate`, left-padded, sampled at the recipe's
    temperature from the whole vocabulary); each reply is cut after its eos or its first stop string."""
    device = next(model.parameters()).device
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, ids in enumerate(contexts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention[row, width - len(ids) :] = 1
    torch.manual_seed(int(torch.randint(2**62, (1,), generator=generator)))  # generate samples from the global RNG
    out = model.generate(
        input_ids=input_ids.to(device), attention_mask=attention.to(device), do_sample=True,
        temperature=recipe.temperature, top_k=0, top_p=1.0, max_new_tokens=recipe.max_new_tokens,
        stop_strings=list(recipe.stop) or None, tokenizer=tokenizer, pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    new = out.sequences[:, width:].cpu()
    logp = torch.log_softmax(torch.stack(out.scores, dim=1).float().cpu(), dim=-1).gather(-1, new.unsqueeze(-1))
    replies = []
    for row in range(len(contexts)):
        ids = new[row].tolist()
        if tokenizer.eos_token_id in ids:
            ids = ids[: ids.index(tokenizer.eos_token_id) + 1]
        cut = stop_string_end(lambda t: tokenizer.decode(t, skip_special_tokens=False), ids, recipe.stop)
        ids = ids[:cut] if cut is not None else ids
        replies.append((ids, logp[row, : len(ids), 0].tolist()))
    return replies


async def _gather(coros: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*coros))
