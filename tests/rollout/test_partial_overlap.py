"""Partial overlap (ROLL's shrink/expand sampler) on real transformers replicas of the tiny model.

A shrink takes the replicas on some devices out of service while the others keep generating: their replies in
flight are asked again elsewhere, no reply of theirs reaches an episode after the shrink, and an expanded
replica serves nothing before it holds the current weights (unless ``skip_load``). Replicas are told apart by
their weights (seed 0 vs seed 1 tiny models, greedy decoding) and by a policy version no other replica has.
Every replica is stopped inside its model's forward pass, so "mid-generation" is a fact, not a timing hope.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support.plugin_envs import SlowEnv

from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings, RolloutConfig, RolloutConfigError, RolloutScheduler
from roll_lightning.rollout.datamodule import RolloutDataModule
from roll_lightning.rollout.engines import EngineRouter, SamplingParams
from roll_lightning.rollout.engines.factory import EngineConfig, EngineConfigError, build_engine, resolve_device
from roll_lightning.rollout.engines.placement import place
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.engines.vllm_engine import cuda_index, pin_device

GREEDY = SamplingParams(max_new_tokens=6, temperature=0)
SHRUNK_VERSION = 99  # only the replica that is shrunk has it: a reply carrying it came from that replica


def prompt(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)[:8] or [1]


class Gate:
    """Holds each engine's worker inside its model's first forward pass until `open`: while held, every
    replica is in the middle of a generation."""

    def __init__(self, loop: asyncio.AbstractEventLoop, engines: list[TransformersEngine]) -> None:
        self._loop, self._open = loop, threading.Event()
        self.inside = [asyncio.Event() for _ in engines]
        for engine, inside in zip(engines, self.inside, strict=True):
            original = engine.model.forward

            def forward(*args: Any, _original: Any = original, _inside: asyncio.Event = inside, **kw: Any) -> Any:
                loop.call_soon_threadsafe(_inside.set)
                self._open.wait()
                return _original(*args, **kw)

            engine.model.forward = forward  # type: ignore[method-assign]

    async def all_inside(self) -> None:
        await asyncio.gather(*(event.wait() for event in self.inside))

    def open(self) -> None:
        self._open.set()


async def test_a_shrink_while_every_replica_is_mid_generation_loses_nothing(
    model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    engines = [TransformersEngine(model_dir_seed1), TransformersEngine(model_dir), TransformersEngine(model_dir)]
    engines[0].policy_version = SHRUNK_VERSION
    router = EngineRouter(engines, ["train", "cpu:1", "cpu:2"])
    gate = Gate(asyncio.get_running_loop(), engines)
    prompts = [prompt(tokenizer, f"episode {i} says hello") for i in range(9)]
    try:
        calls = [asyncio.create_task(router.generate(p, GREEDY, key=f"episode-{i}")) for i, p in enumerate(prompts)]
        await gate.all_inside()  # every replica is inside a forward pass, with its share of the calls
        on_shrunk = [key for key, index in router._route.items() if index == 0]
        moved = await router.shrink(["train"])
        gate.open()
        replies = await asyncio.gather(*calls)
        # what the replicas left say for these prompts, asked directly
        expected = [await engines[1].generate(p, GREEDY) for p in prompts]
        after = await router.generate(prompts[0], GREEDY, key="episode-0")
    finally:
        gate.open()
        await router.close()

    assert moved["replicas"] == [0] and moved["devices"] == ["train"] and moved["active"] == [1, 2]
    assert moved["aborted"] == len(on_shrunk) == 3 and moved["migrated"] == 3
    assert router.counters["rerouted"] == 3
    assert [r.token_ids for r in replies] == [e.token_ids for e in expected]  # each reply from a replica left
    assert all(r.policy_version == 0 and r.finish_reason in ("stop", "length") for r in replies)
    assert after.policy_version == 0 and router.replica_for("episode-0") in (1, 2)
    assert router.routed[0] == 3  # replica 0 was asked only before the shrink


async def test_a_reply_finished_but_unread_at_the_shrink_is_dropped(model_dir: Path, tokenizer: Any) -> None:
    """Replica 0's reply is complete before the shrink, but the router has not read it yet: the epoch rule drops
    it and the turn is asked again of the replica left. Replica 0 answers in one step (a stand-in that returns
    its own earlier real reply), so asyncio's FIFO order puts the shrink between the answer and its reading."""
    engines = [TransformersEngine(model_dir), TransformersEngine(model_dir)]
    router = EngineRouter(engines, ["train", "cpu"])
    p = prompt(tokenizer, "hello")
    try:
        stale = await engines[0].generate(p, GREEDY)
        engines[0].policy_version = SHRUNK_VERSION

        async def answer_at_once(*args: Any, **kwargs: Any) -> Any:
            return replace(stale, policy_version=SHRUNK_VERSION)

        engines[0].generate = answer_at_once  # type: ignore[method-assign]
        call = asyncio.create_task(router.generate(p, GREEDY, key="k"))
        await asyncio.sleep(0)  # the router places the call on replica 0 (least loaded, first)
        (inner,) = router._calls[0]
        await asyncio.sleep(0)  # replica 0 answers; the router's coroutine is only scheduled to read it
        answered_unread = inner.done() and not call.done()
        moved = await router.shrink(["train"])
        reply = await call
    finally:
        await router.close()
    assert answered_unread
    assert moved["aborted"] == 0  # nothing left to cancel: the reply was already there
    assert reply.policy_version == 0 and reply.token_ids == stale.token_ids
    assert router.counters["rerouted"] == 1


async def test_an_expanded_replica_serves_only_with_the_current_weights(
    model_dir: Path, model_dir_seed1: Path, tokenizer: Any
) -> None:
    from transformers import AutoModelForCausalLM

    new = AutoModelForCausalLM.from_pretrained(model_dir_seed1, dtype=torch.float32).state_dict()
    engines = [TransformersEngine(model_dir), TransformersEngine(model_dir)]
    router = EngineRouter(engines, ["train", "cpu"])
    p = prompt(tokenizer, "expand me")
    keys = [f"k{i}" for i in range(6)]
    try:
        await router.shrink(["train"])
        await router.load_weights(new, version=1)  # the shrunk replica is skipped: it stays at version 0
        versions_while_shrunk = [e.policy_version for e in engines]
        moved = await router.expand(["train"])
        requests_before = engines[0].stats()["requests"]
        pending = await asyncio.gather(*(router.generate(p, GREEDY, key=k) for k in keys))
        requests_pending = engines[0].stats()["requests"] - requests_before
        for key in keys:
            router.release(key)
        await router.load_weights(new, version=2)  # the pending replica is loaded and serves again
        served = await asyncio.gather(*(router.generate(p, GREEDY, key=k + "b") for k in keys))
        requests_served = engines[0].stats()["requests"] - requests_before
        # skip_load: the replica serves its older weights at once, and says so
        await router.shrink(["train"])
        await router.load_weights(new, version=3)
        skipped = await router.expand(["train"], skip_load=True)
        version_after_skip = router.policy_version
    finally:
        await router.close()

    assert versions_while_shrunk == [0, 1]
    assert moved == {"replicas": [0], "devices": ["train"], "serving": [], "pending": [0], "skip_load": False}
    assert requests_pending == 0 and all(g.policy_version == 1 for g in pending)
    assert requests_served == 3 and all(g.policy_version == 2 for g in served)
    assert len({tuple(g.token_ids) for g in [*pending, *served]}) == 1  # the same (new) weights everywhere
    assert skipped["serving"] == [0] and version_after_skip == 2  # staleness counts the older weights


async def test_shrink_and_expand_refuse_what_cannot_work(model_dir: Path) -> None:
    router = EngineRouter([TransformersEngine(model_dir), TransformersEngine(model_dir)], ["train", "cpu"])
    try:
        with pytest.raises(ValueError, match=r"no replica on \['cuda:3'\]; the replicas are on \['train', 'cpu'\]"):
            await router.shrink(["cuda:3"])
        with pytest.raises(ValueError, match="no replica would be left to generate"):
            await router.shrink(["train", "cpu"])
        assert (await router.expand(["train"]))["replicas"] == []  # not shrunk: nothing to expand
        assert router.active == [0, 1]
    finally:
        await router.close()


async def test_the_scheduler_shrinks_mid_batch_and_every_turn_is_whole(
    pool: EnvPool, model_dir: Path, tokenizer: Any
) -> None:
    """`shrink_sampler` while both replicas are inside a forward pass, during `get_batch`: the batch is complete,
    each turn holds one whole reply of the replica left, and the env was stepped exactly once per turn."""
    engines = [TransformersEngine(model_dir), TransformersEngine(model_dir)]
    engines[0].policy_version = SHRUNK_VERSION
    router = EngineRouter(engines, ["train", "cpu"])
    gate = Gate(asyncio.get_running_loop(), engines)
    turns = 2
    config = RolloutConfig(
        env_id="slow",
        env_config={"max_steps": turns},
        group_size=2,
        batch_size=4,
        concurrent_episodes=4,
        episode=EpisodeSettings(
            max_turns=4, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=6, temperature=1.0)
        ),
    )
    scheduler = RolloutScheduler(pool, router, tokenizer, config)
    steps_before = int(SlowEnv.executed_steps)
    try:
        task = asyncio.create_task(scheduler.get_batch())
        await gate.all_inside()
        moved = await scheduler.shrink_sampler(["train"])
        gate.open()
        batch = await task
        steps = int(SlowEnv.executed_steps) - steps_before
        expanded = await scheduler.expand_sampler(["train"], skip_load=True)
    finally:
        gate.open()
        await scheduler.close()
        await router.close()

    assert moved["aborted"] >= 1 and moved["active"] == [1]
    assert expanded["serving"] == [0]
    assert len(batch.episodes) == 4
    for episode in batch.episodes:
        assert len(episode.turns) == turns
        for turn in episode.turns:
            assert turn.policy_version == 0  # never a reply of the shrunk replica (version 99)
            assert len(turn.logprobs) == len(turn.response_ids) >= 1
    assert steps == 4 * turns  # one env step per whole reply: no aborted reply reached an env


async def test_a_scheduler_without_replicas_says_so(pool: EnvPool, model_dir: Path, tokenizer: Any) -> None:
    engine = TransformersEngine(model_dir)
    scheduler = RolloutScheduler(pool, engine, tokenizer, RolloutConfig(env_id="slow"))
    try:
        with pytest.raises(TypeError, match="shrink_sampler: the engine is one TransformersEngine, not replicas"):
            await scheduler.shrink_sampler(["train"])
    finally:
        await scheduler.close()
        await engine.close()


def test_devices_resolve_per_rank() -> None:
    devices = ["train", "cuda:{local_rank + local_world_size}"]
    placements = [place(devices, 1, "cuda", train_device=f"cuda:{r}", local_rank=r, local_world_size=4) for r in (0, 3)]
    assert [(p.labels, p.devices) for p in placements] == [
        (["train", "cuda:4"], ["cuda:0", "cuda:4"]),
        (["train", "cuda:7"], ["cuda:3", "cuda:7"]),
    ]
    plain = place(None, 2, "cpu", train_device="cpu")
    assert (plain.labels, plain.devices) == (["replica0", "replica1"], ["cpu", "cpu"])  # no replica shares "train"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"devices": []}, "data.engine.devices must be a non-empty list"),
        ({"devices": ["train", "gpu0"]}, "data.engine.devices must be 'train' or a device string .* got 'gpu0'"),
        ({"devices": ["cuda:{rank}"]}, r"data.engine.devices must be .*\{rank\}: only integers, local_rank"),
        ({"devices": ["cuda:{__import__('os')}"]}, "data.engine.devices must be .*only integers"),
        ({"devices": ["train", "cpu"], "replicas": 3}, "data.engine.replicas is 3 but data.engine.devices lists 2"),
    ],
)
def test_bad_devices_are_named(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        EngineConfig(**overrides)


@pytest.mark.parametrize("devices", [None, ["cpu", "cpu"], ["train"]])
def test_partial_overlap_needs_a_train_replica_and_another(devices: list[str] | None) -> None:
    with pytest.raises(RolloutConfigError, match="data.colocate: partial needs data.engine.devices to list"):
        RolloutDataModule("unused", engine=EngineConfig(devices=devices), colocate="partial")


def test_build_engine_labels_the_replicas(model_dir: Path) -> None:
    router = build_engine(EngineConfig(kind="transformers", devices=["train", "cpu"]), model_dir, train_device="cpu")
    assert isinstance(router, EngineRouter) and router.devices == ["train", "cpu"]
    assert [str(r.device) for r in router.replicas] == ["cpu", "cpu"]
    asyncio.run(router.close())


@pytest.mark.parametrize(
    ("setting", "train_device", "expected"),
    [
        ("cpu", "cpu", "cpu"),
        ("cuda", "cuda:1", "cuda:1"),  # rank 1's engine on rank 1's GPU, not GPU 0
        ("cuda:3", "cuda:1", "cuda:3"),  # an explicit GPU stays
        ("cuda", None, "cuda"),  # no trainer (a script): the platform default
    ],
)
def test_a_bare_cuda_engine_goes_to_the_ranks_gpu(setting: str, train_device: str | None, expected: str) -> None:
    assert resolve_device(setting, train_device) == expected


def test_vllm_is_pinned_to_the_gpu_it_is_placed_on() -> None:
    """vLLM's in-process executor reads the worker's GPU from ``device_config.device``; `EngineArgs` leaves the
    bare type there (GPU 0). A stand-in for the config object vLLM builds (no CUDA here) records what is set."""
    config = SimpleNamespace(device_config=SimpleNamespace(device=torch.device("cuda")))
    pin_device(config, "cuda:3")
    assert config.device_config.device == torch.device("cuda", 3)
    on_cpu = SimpleNamespace(device_config=SimpleNamespace(device=torch.device("cpu")))
    pin_device(on_cpu, "cpu")
    assert on_cpu.device_config.device == torch.device("cpu")
    assert [cuda_index(d) for d in ("cuda:4", "cuda", "cpu")] == [4, None, None]
