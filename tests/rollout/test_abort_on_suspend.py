"""``data.rollout.on_suspend``: what a suspend (before a weight load or an engine sleep) does with replies in flight.

``wait`` (the default) lets them finish with the old weights; ``abort`` cancels them at once and asks each of
those turns again after the resume, with the new weights. These tests check it by the order of events and by
counts, never by wall time: the engine holds its replies until the test lets them go, so a suspend that waited
for them could only return after the release. Env steps are counted on the server (the ``slow`` counter env,
whose observation is ``seed=S t=N``), so a turn stepped twice or a partial reply sent to the env would show.

The scheduling tests use `SimulatedEngine` (a scheduling stand-in with scripted replies, never for training);
the last test aborts the real transformers engine on the tiny model in the middle of a generation.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from support.held_forward import hold_at_forward
from support.plugin_envs import SlowEnv

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutConfigError, RolloutScheduler
from roll_lightning.rollout.engines import Generation, SamplingParams, SimulatedEngine
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.episodes.episode import Episode

MOVES = ["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>", "<answer>Right</answer>"]
TURNS = 3  # the slow env truncates after max_steps steps


class HeldEngine(SimulatedEngine):
    """`SimulatedEngine` (a scheduling stand-in: scripted replies, no model) whose replies are held until the test
    calls `let_go`, logging every request, cancellation and reply in order."""

    def __init__(self, tokenizer: Any, log: list[tuple[Any, ...]]) -> None:
        super().__init__(tokenizer, MOVES, latency_s=0.001)
        self.log = log
        self.held = 0
        self._released = asyncio.Event()
        self._changed = asyncio.Event()

    def let_go(self) -> None:
        """Let every held reply and every later one go (the engine is not slow any more)."""
        self.log.append(("released",))
        self._released.set()

    async def holding(self, n: int) -> None:
        """Wait until ``n`` replies are held."""
        while self.held < n:
            self._changed.clear()
            await self._changed.wait()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        self.log.append(("request", key, self.policy_version))
        try:
            if not self._released.is_set():
                self.held += 1
                self._changed.set()
                try:
                    await self._released.wait()
                finally:
                    self.held -= 1
            generation = await super().generate(prompt_ids, params, key=key)
        except asyncio.CancelledError:
            self.log.append(("cancelled", key))
            raise
        self.log.append(("reply", key, generation.policy_version))
        return generation


def config(**overrides: Any) -> RolloutConfig:
    base: dict[str, Any] = {
        "env_id": "slow",
        "env_config": {"max_steps": TURNS},
        "group_size": 2,
        "batch_size": 4,
        "concurrent_episodes": 8,
        "max_staleness": 1,  # groups started at version 0 may finish at version 1 (not dropped as stale)
        "episode": EpisodeSettings(max_turns=5, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)),
    }
    return RolloutConfig(**{**base, **overrides})


async def suspend_while_held(scheduler: RolloutScheduler, engine: Any, log: list[tuple[Any, ...]]) -> bool:
    """Suspend while the engine holds every reply in flight, then let them go. True when the suspend returned
    before the release: it did not wait for the replies (the loop turns are a bound on work, not on time)."""

    async def suspend() -> None:
        await scheduler.suspend()
        log.append(("suspended",))

    suspending = asyncio.create_task(suspend())
    for _ in range(1000):
        if suspending.done():
            break
        await asyncio.sleep(0)
    returned_first = suspending.done()
    engine.let_go()
    await suspending
    return returned_first


def scripted(tokenizer: Any) -> list[list[int]]:
    """The whole replies the simulated engine may give: each scripted text, tokenised, with its eos."""
    return [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id] for text in MOVES]


def steps_run() -> int:
    """Env steps the `slow` envs of this process's servers really executed."""
    return int(SlowEnv.executed_steps)


def check_whole_turns(episode: Episode, replies: list[list[int]]) -> None:
    """Every turn holds one whole scripted reply, and the env was stepped exactly once per turn, in order."""
    assert len(episode.turns) == TURNS
    for k, turn in enumerate(episode.turns):
        assert turn.response_ids in replies and turn.finish_reason == "stop"
        assert len(turn.logprobs) == len(turn.response_ids)
        assert turn.observation == f"seed={episode.seed} t={k}"  # the env state the reply answered: t = k steps
    assert episode.final_observation == f"seed={episode.seed} t={TURNS}"


async def ready_groups(scheduler: RolloutScheduler, n: int) -> None:
    while scheduler.ready < n:
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_abort_returns_at_once_and_redoes_the_turns_with_the_new_weights(
    pool: EnvPool, tokenizer: Any, mode: str
) -> None:
    log: list[tuple[Any, ...]] = []
    sim = HeldEngine(tokenizer, log)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config(mode=mode, on_suspend="abort"))
    in_flight = 8 if mode == "async" else 4  # async runs one batch ahead (max_staleness 1); lock-step does not
    steps_before = steps_run()
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await sim.holding(in_flight)  # every episode waits for its first reply
        assert scheduler.generating == in_flight
        assert await suspend_while_held(scheduler, sim, log), "suspend waited for the replies in flight"
        await sim.load_weights({}, version=1)
        await scheduler.resume()
        batch = await task
        if mode == "async":
            await ready_groups(scheduler, 2)  # the run-ahead groups complete too; nothing else starts meanwhile
        steps, requests, played = steps_run() - steps_before, sim.stats()["requests"], len(log)
        state = scheduler.state_dict()
        rest = await scheduler.get_batch() if mode == "async" else None  # the run-ahead groups
    finally:
        await scheduler.close()

    # the suspend cancelled every reply in flight and returned before any reply came back
    suspended = log.index(("suspended",))
    assert log.index(("released",)) > suspended
    before = Counter(event[0] for event in log[:suspended])
    assert before["cancelled"] == in_flight and before["reply"] == 0
    assert scheduler.counters["turns_aborted"] == in_flight

    # after the resume each aborted turn was asked again, written by the new weights, and kept whole
    episodes = list(batch.episodes) + (list(rest.episodes) if rest is not None else [])
    assert len(episodes) == in_flight
    for episode in episodes:
        check_whole_turns(episode, scripted(tokenizer))
        assert [t.policy_version for t in episode.turns] == [1] * TURNS
        assert [t.redone for t in episode.turns] == [1] + [0] * (TURNS - 1)
    assert set(batch.policy_version.tolist()) == {1} and batch.metrics["rollout/staleness_mean"] == 0
    assert batch.metrics["rollout/turns_redone"] == 4 and batch.metrics["rollout/turns_aborted_total"] == in_flight
    after = [e for e in log[suspended:played] if e[0] == "reply"]
    assert len(after) == in_flight * TURNS and {e[2] for e in after} == {1}  # no reply of version 0 came back

    # the env was stepped once per turn, with a whole reply: nothing aborted ever reached it
    assert steps == requests == in_flight * TURNS

    # the resume position is untouched by the redo: exactly the unconsumed groups would be played again
    lane = state["lanes"][scheduler.lanes[0].tag]
    consumed = {int(g.split("/g")[1].split("/")[0]) for g in batch.traj_group_id}
    started = set(range(lane["next_local"]))
    replay = {i for i in started if i >= lane["watermark"] and i not in lane["settled_above"]}
    assert started == set(range(in_flight // 2)) and replay == started - consumed


@pytest.mark.parametrize("mode", ["async", "lockstep"])
async def test_wait_is_the_default_and_lets_the_replies_finish_with_the_old_weights(
    pool: EnvPool, tokenizer: Any, mode: str
) -> None:
    log: list[tuple[Any, ...]] = []
    sim = HeldEngine(tokenizer, log)
    cfg = config(mode=mode)
    assert cfg.on_suspend == "wait"
    scheduler = RolloutScheduler(pool, sim, tokenizer, cfg)
    in_flight = 8 if mode == "async" else 4
    steps_before = steps_run()
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await sim.holding(in_flight)
        assert not await suspend_while_held(scheduler, sim, log), "suspend returned with replies in flight"
        await sim.load_weights({}, version=1)
        await scheduler.resume()
        batch = await task
        if mode == "async":
            await ready_groups(scheduler, 2)
        steps = steps_run() - steps_before
    finally:
        await scheduler.close()

    suspended = log.index(("suspended",))
    between = log[log.index(("released",)) : suspended]
    assert Counter(e[0] for e in between)["reply"] == in_flight and {e[2] for e in between if e[0] == "reply"} == {0}
    assert not [e for e in log if e[0] == "cancelled"] and scheduler.counters["turns_aborted"] == 0
    for episode in batch.episodes:
        check_whole_turns(episode, scripted(tokenizer))
        assert [t.policy_version for t in episode.turns] == [0] + [1] * (TURNS - 1)  # the first reply: old weights
        assert not any(t.redone for t in episode.turns)
    assert batch.metrics["rollout/turns_redone"] == 0 and batch.metrics["rollout/turns_aborted_total"] == 0
    assert steps == in_flight * TURNS


async def test_abort_keeps_max_staleness_as_it_was(pool: EnvPool, tokenizer: Any) -> None:
    """On-policy (max_staleness 0): groups in flight at a weight update are too stale and dropped at the resume,
    as with ``wait``; their aborted turns are not redone, and the batch is played by new groups."""
    log: list[tuple[Any, ...]] = []
    sim = HeldEngine(tokenizer, log)
    scheduler = RolloutScheduler(pool, sim, tokenizer, config(max_staleness=0, on_suspend="abort"))
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await sim.holding(4)
        assert await suspend_while_held(scheduler, sim, log)
        await sim.load_weights({}, version=1)
        await scheduler.resume()
        batch = await task
    finally:
        await scheduler.close()
    assert batch.metrics["rollout/dropped_groups_stale_total"] == 2
    assert batch.metrics["rollout/turns_aborted_total"] == 4 and batch.metrics["rollout/turns_redone"] == 0
    assert {g.split("/")[1] for g in batch.traj_group_id} == {"g2", "g3"}
    assert set(batch.policy_version.tolist()) == {1}
    for episode in batch.episodes:
        check_whole_turns(episode, scripted(tokenizer))


def test_on_suspend_is_wait_or_abort() -> None:
    assert RolloutConfig().on_suspend == "wait"
    with pytest.raises(RolloutConfigError, match="data.rollout.on_suspend must be one of wait, abort"):
        config(on_suspend="drop")


async def test_transformers_engine_aborted_mid_generation_keeps_no_partial_reply(
    pool: EnvPool, model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    """The real engine on the tiny model, stopped inside a generation (two tokens sampled): the suspend
    returns while the worker is still in that generation, its output is thrown away, and the turn is written
    again, whole, by the weights loaded meanwhile (their log-probs match a recomputation with those weights)."""
    from transformers import AutoModelForCausalLM

    new_model = AutoModelForCausalLM.from_pretrained(model_dir_seed1, dtype=torch.float32).eval()
    engine = TransformersEngine(model_dir, seed=0)
    in_generation, let_go = hold_at_forward(engine.model)  # two tokens in
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=sampling)
    cfg = RolloutConfig(
        env_id="slow",
        env_config={"max_steps": 2},
        group_size=1,
        batch_size=1,
        max_staleness=1,
        on_suspend="abort",
        episode=episode,
    )
    scheduler = RolloutScheduler(pool, engine, tokenizer, cfg)
    steps_before = steps_run()
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await in_generation.wait()
        while scheduler.generating < 2:  # the run-ahead episode's first request too (queued behind the batch)
            await asyncio.sleep(0.01)
        suspending = asyncio.create_task(scheduler.suspend())
        for _ in range(1000):
            if suspending.done():
                break
            await asyncio.sleep(0)
        returned_mid_generation = suspending.done() and not let_go.is_set()
        let_go.set()
        await suspending
        await engine.load_weights(new_model.state_dict(), version=1)  # runs once the aborted generation ended
        await scheduler.resume()
        batch = await task
        await ready_groups(scheduler, 1)  # the run-ahead episode (max_staleness 1) is complete too
        steps, requests = steps_run() - steps_before, engine.stats()["requests"]
        rest = await scheduler.get_batch()
    finally:
        let_go.set()
        await scheduler.close()
        await engine.close()

    assert returned_mid_generation
    assert scheduler.counters["turns_aborted"] == 2  # the batch's first reply and the run-ahead one's
    played = [*batch.episodes, *rest.episodes]
    turns = [t for ep in played for t in ep.turns]
    assert [len(ep.turns) for ep in played] == [2, 2] and [t.redone for t in turns] == [1, 0, 1, 0]
    # one env step per whole reply; the aborted generation's output was never delivered nor sent to the env
    assert steps == requests == len(turns) == 4
    for turn in turns:
        assert turn.policy_version == 1 and turn.finish_reason in ("stop", "length")
        assert len(turn.logprobs) == len(turn.response_ids) and 1 <= len(turn.response_ids) <= 8
        assert turn.finish_reason == "stop" or len(turn.response_ids) == 8
    # the row's replies are exactly what the new weights sampled: their log-probs recomputed with those weights
    with torch.no_grad():
        logits = new_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = batch.response_mask[:, 1:]
    torch.testing.assert_close(logp[mask], batch.behaviour_logprobs[:, 1:][mask], atol=1e-4, rtol=1e-4)
