"""``data.rollout.on_suspend: keep``: a suspend stops each reply in flight where it is; after the weight load it
goes on from prompt + the tokens it kept, under the new weights, each token with the log-prob of the weights that
sampled it. Checked by order of events and by the tokens, never by wall time.

The scheduling test uses `SimulatedEngine` (a scheduling stand-in with scripted replies, never for training);
the others stop the real transformers and vLLM engines on the tiny model in the middle of a generation.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from support.held_forward import hold_at_forward
from test_abort_on_suspend import TURNS, check_whole_turns, config, scripted, steps_run

from roll_lightning.algorithms.correction import importance_weights
from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutScheduler
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.scheduling.gate import GenerationGate

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]


async def until(condition: Any, turns: int = 100_000) -> None:
    """Let the loop run until ``condition()`` (a bound on loop turns, not on time)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never came true")


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_keep_stops_the_replies_in_flight_and_the_new_weights_finish_them(
    pool: EnvPool, tokenizer: Any, mode: str
) -> None:
    """A suspend stops every reply in flight (none had finished), and each is then finished by version 1 from where
    it stopped, in the rest of its time: the env gets the whole scripted reply, once."""
    asked = [0]

    def latency() -> float:  # the first replies are long, so all of them are in flight at once whatever the load
        asked[0] += 1
        return 2.0 if asked[0] <= in_flight else 0.01

    in_flight = 8 if mode == "async" else 4
    sim = SimulatedEngine(tokenizer, MOVES, latency_s=latency)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config(mode=mode, on_suspend="keep"))
    steps_before = steps_run()
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await until(lambda: scheduler.generating == in_flight)
        await scheduler.suspend()  # returns once every reply stopped: none of them is finished
        assert scheduler.generating == 0 and scheduler.counters["turns_kept"] == in_flight
        await sim.load_weights({}, version=1)
        await scheduler.resume()
        batch = await task
        steps = steps_run() - steps_before
    finally:
        await scheduler.close()
    for episode in batch.episodes:
        check_whole_turns(episode, scripted(tokenizer))  # whole replies, one env step each
        first = episode.turns[0]
        if first.versions:  # some tokens came before the suspend
            ((start, old), (cut, new)) = first.versions
            assert (start, old, new) == (0, 0, 1) and 0 < cut < len(first.response_ids)
        assert first.policy_version == (0 if first.versions else 1)  # as old as its oldest token
        assert [t.policy_version for t in episode.turns[1:]] == [1] * (TURNS - 1)
    assert batch.metrics["rollout/turns_kept_total"] == in_flight and batch.metrics["rollout/turns_redone"] == 0
    assert steps >= len(batch.episodes) * TURNS


def test_keep_needs_an_engine_that_can_stop_its_replies(tokenizer: Any) -> None:
    class CannotStop:  # a fake: only its missing `interrupt` is under test
        policy_version = 0

    with pytest.raises(ValueError, match="on_suspend: keep needs an engine that can stop its replies where they are"):
        GenerationGate(CannotStop(), "keep", {})  # type: ignore[arg-type]


def logprobs_under(model: Any, prompt: list[int], reply: list[int]) -> torch.Tensor:
    """The trainer's view: log p(reply token | everything before it) under ``model``."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1)


def greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


async def test_a_kept_reply_is_the_old_weights_tokens_then_what_the_new_weights_sample_from_there(
    pool: EnvPool, model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    """The real engine on the tiny model, greedy, stopped inside a generation a few tokens in; new weights are
    loaded; the reply is token for token the old weights' greedy tokens up to the stop, then the new weights'
    greedy continuation of prompt + those tokens, and each piece's engine log-probs match the trainer's
    recomputation with the weights that sampled it; the batch carries them as its behaviour log-probs. Two groups are
    in flight at the stop (one run ahead, ``max_staleness`` 1) and either may own the held generation, so the check
    reads the one that was cut."""
    from transformers import AutoModelForCausalLM

    old_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    new_model = AutoModelForCausalLM.from_pretrained(model_dir_seed1, dtype=torch.float32).eval()
    engine = TransformersEngine(model_dir, seed=0)
    in_generation, let_go = hold_at_forward(engine.model)  # two tokens in
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    cfg = RolloutConfig(
        env_id="slow", env_config={"max_steps": 1}, group_size=1, batch_size=1, on_suspend="keep",
        max_staleness=1,  # a reply is as old as its oldest token: on-policy would drop this group at the resume
        episode=EpisodeSettings(max_turns=1, max_context_tokens=1024, sampling=sampling),
    )  # fmt: skip
    scheduler = RolloutScheduler(pool, engine, tokenizer, cfg)
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await in_generation.wait()
        suspending = asyncio.create_task(scheduler.suspend())
        await asyncio.sleep(0.05)
        let_go.set()  # the third forward finishes; the interrupt ends the generation there
        await suspending
        await engine.load_weights(new_model.state_dict(), version=1)
        await scheduler.resume()
        batches = [await task, await scheduler.get_batch()]  # this batch's group and the one run ahead of it
    finally:
        let_go.set()
        await scheduler.close()
        await engine.close()

    # whichever group's env answered first had its request in the held generation: that episode was cut
    kept = [b for b in batches if b.episodes[0].turns[0].versions]
    assert kept, f"no reply was kept across the load: {[b.episodes[0].turns[0].versions for b in batches]}"
    batch = kept[0]
    ((episode,),) = [batch.episodes]
    (turn,) = episode.turns
    ((start, old), (cut, new)) = turn.versions
    assert (start, old, new) == (0, 0, 1) and 1 <= cut < sampling.max_new_tokens
    prompt, reply = list(turn.prompt_ids), list(turn.response_ids)
    assert reply[:cut] == greedy(old_model, prompt, cut)
    rest = greedy(new_model, prompt + reply[:cut], len(reply) - cut)
    assert reply[cut:] == rest[: len(reply) - cut] and (turn.finish_reason == "stop" or len(reply) == 12)
    engine_logprobs = torch.tensor(turn.logprobs)
    torch.testing.assert_close(engine_logprobs[:cut], logprobs_under(old_model, prompt, reply)[:cut], atol=1e-4, rtol=0)
    torch.testing.assert_close(engine_logprobs[cut:], logprobs_under(new_model, prompt, reply)[cut:], atol=1e-4, rtol=0)
    mask = batch.response_mask[0].bool()
    torch.testing.assert_close(batch.behaviour_logprobs[0][mask], engine_logprobs, atol=0, rtol=0)
    assert turn.policy_version == 0 and batch.policy_version.tolist() == [0]  # counted by its oldest token
    # the correction, with the trainer at the new weights: 1 on what they sampled, p_new / p_old before the stop
    trainer_logp = torch.zeros_like(batch.behaviour_logprobs)
    trainer_logp[0][mask] = logprobs_under(new_model, prompt, reply)
    weights = importance_weights(trainer_logp, batch.behaviour_logprobs, batch.response_mask, cap=1e6).weights
    expected = torch.exp(logprobs_under(new_model, prompt, reply) - logprobs_under(old_model, prompt, reply))
    torch.testing.assert_close(weights[0][mask][:cut], expected[:cut], atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(weights[0][mask][cut:], torch.ones(len(reply) - cut), atol=1e-3, rtol=0)
    assert (expected[:cut] - 1).abs().max() > 1e-2  # the two weights differ where the old ones sampled
    assert episode.final_observation == f"seed={episode.seed} t=1"  # the env got the whole reply, once


async def test_an_agents_call_in_flight_at_a_sync_is_finished_by_the_new_weights(
    model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    """The agent endpoint behind a ``keep`` gate: an OpenAI-client call stopped a few tokens in by a sync gets,
    after the load, one whole reply; its record says where the weights changed and its log-probs are those the
    client saw."""
    import openai
    from transformers import AutoModelForCausalLM

    from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig

    new_model = AutoModelForCausalLM.from_pretrained(model_dir_seed1, dtype=torch.float32).eval()
    engine = TransformersEngine(model_dir, seed=0)
    gate = GenerationGate(engine, "keep", {})
    served = AgentEndpoint(gate, tokenizer, EndpointConfig(max_context_tokens=2048, max_tokens=12))  # type: ignore[arg-type]
    in_generation, let_go = hold_at_forward(engine.model)  # two tokens in
    await served.start()
    key = served.open()
    agent = openai.AsyncOpenAI(base_url=served.url(key), api_key="unused", max_retries=0)
    try:
        messages = [{"role": "user", "content": "Go."}]
        call = asyncio.create_task(
            agent.chat.completions.create(
                model="policy",
                messages=messages,
                temperature=0,
                max_tokens=12,
                logprobs=True,  # type: ignore[arg-type]
            )
        )
        await in_generation.wait()
        closing = asyncio.create_task(gate.close())
        await asyncio.sleep(0.05)
        let_go.set()
        await closing
        await engine.load_weights(new_model.state_dict(), version=1)
        gate.open()
        answer = await call
    finally:
        let_go.set()
        await agent.close()
        await served.stop()
        await engine.close()
    (recorded,) = served.finish(key).calls
    ((start, old), (cut, new)) = recorded.versions
    assert (start, old, new) == (0, 0, 1) and 1 <= cut < len(recorded.reply_ids)
    assert [t.logprob for t in answer.choices[0].logprobs.content] == recorded.logprobs  # type: ignore[union-attr]
    assert answer.usage.completion_tokens == len(recorded.reply_ids)  # type: ignore[union-attr]
    assert recorded.policy_version == 0 and answer.system_fingerprint == "policy-v0"  # as old as its oldest token
