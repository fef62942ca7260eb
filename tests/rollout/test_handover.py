"""`Handover`: the engine's turns around an update. A real tiny engine takes the weights; the scheduler is a
recording stand-in (`RecordingScheduler`, named so: the test is about the order of calls), so each test reads
the sequence the rollout sees: pause holds replies and sleeps, publish wakes, holds, loads, and lets generation go
on exactly once; a failed load never lets replies go on from half-loaded weights."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from roll_lightning.models.tiny import tiny_model
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.handover import AdapterWeights, Handover, WeightBuckets, plan_handoff
from roll_lightning.rollout.runtime.loop import RolloutLoop
from roll_lightning.training.weights import weight_buckets


class RecordingScheduler:
    """Records the scheduler calls a handover makes (a stand-in: the order is what is tested)."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    async def suspend(self) -> None:
        self.calls.append("suspend")

    async def resume(self) -> None:
        self.calls.append("resume")

    async def shrink_sampler(self, devices: list[str], free_memory: Any = None) -> dict[str, Any]:
        self.calls.append(f"shrink {devices} freeing {free_memory('train')}")
        return {"replicas": ["train"], "aborted": 2, "migrated": 1, "released_bytes": 2**30}

    async def expand_sampler(self, devices: list[str]) -> dict[str, Any]:
        self.calls.append(f"expand {devices}")
        return {"replicas": ["train"]}


@pytest.fixture
def engine_and_trainer(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[TransformersEngine, Any, RolloutLoop]]:
    from transformers import AutoModelForCausalLM

    path = tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)
    loop = RolloutLoop("test-handover")  # the rollout's own loop thread: `call` runs a coroutine there and waits
    engine = TransformersEngine(path)
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in trainer.parameters():
            p.add_(0.01)  # the new policy differs from the engine's
    yield engine, trainer, loop
    loop.call(engine.close())
    loop.close()


def recorded(engine: TransformersEngine, calls: list[str]) -> None:
    for name in ("sleep", "wake", "load_weights"):
        method = getattr(engine, name)

        async def call(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls.append(f"engine.{_name}")
            return await _method(*args)

        setattr(engine, name, call)


def test_pause_then_publish_loads_the_new_weights_with_replies_held_and_resumes_once(
    engine_and_trainer: tuple[TransformersEngine, Any, RolloutLoop],
) -> None:
    engine, trainer, loop = engine_and_trainer
    calls: list[str] = []
    recorded(engine, calls)
    handover = Handover(engine, RecordingScheduler(calls), loop.call, colocate=True)  # type: ignore[arg-type]
    assert handover.pause(plan_handoff("cpu", True), lambda device: None, "cpu") == {}
    metrics = handover.publish(WeightBuckets(weight_buckets(trainer, 20_000)), version=3)
    assert calls == ["suspend", "engine.sleep", "engine.wake", "suspend", "engine.load_weights", "resume"]
    assert engine.policy_version == handover.engine_version == 3
    assert metrics["sync/policy_version"] == 3 and metrics["sync/buckets"] > 1 and metrics["sync/adapter"] == 0
    assert "timing/wake_s" in metrics
    expected = trainer.state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in engine.model.state_dict().items())
    # without a pause (a restored checkpoint caught up before play): nothing to wake
    calls.clear()
    handover.publish(WeightBuckets(weight_buckets(trainer, 20_000)), version=4)
    assert calls == ["suspend", "engine.load_weights", "resume"]


def test_a_partial_overlap_shrinks_and_expands_the_train_replicas(
    engine_and_trainer: tuple[TransformersEngine, Any, RolloutLoop],
) -> None:
    engine, trainer, loop = engine_and_trainer
    calls: list[str] = []
    handover = Handover(engine, RecordingScheduler(calls), loop.call, colocate="partial")  # type: ignore[arg-type]
    free = {"cuda:0": 5 * 2**30}
    shrunk = handover.pause(plan_handoff("cuda", "partial"), free.get, "cuda:0")  # `train` is read on cuda:0
    assert calls == [f"shrink ['train'] freeing {5 * 2**30}"]
    assert shrunk == {
        "rollout/shrink_replicas": 1.0,
        "rollout/shrink_aborted": 2.0,
        "rollout/shrink_migrated": 1.0,
        "rollout/shrink_released_gib": 1.0,
    }
    metrics = handover.publish(WeightBuckets(weight_buckets(trainer, 2**30)), version=1)
    assert calls[1:] == ["expand ['train']", "suspend", "resume"]
    assert metrics["rollout/expand_replicas"] == 1.0 and metrics["sync/buckets"] == 1.0


def test_a_failed_load_keeps_replies_held(engine_and_trainer: tuple[TransformersEngine, Any, RolloutLoop]) -> None:
    """No reply may come from half-loaded weights: the error reaches the trainer and generation stays held."""
    engine, trainer, loop = engine_and_trainer
    calls: list[str] = []
    handover = Handover(engine, RecordingScheduler(calls), loop.call, colocate=False)  # type: ignore[arg-type]
    wrong = iter([[("model.no_such_weight", torch.zeros(3))]])
    with pytest.raises(Exception, match="no_such_weight"):
        handover.publish(WeightBuckets(wrong), version=1)
    assert calls == ["suspend"] and engine.policy_version == 0


def test_adapters_for_an_engine_without_lora_are_refused_in_one_line(
    engine_and_trainer: tuple[TransformersEngine, Any, RolloutLoop],
) -> None:
    engine, _, loop = engine_and_trainer
    handover = Handover(engine, RecordingScheduler([]), loop.call, colocate=False)  # type: ignore[arg-type]
    assert not handover.takes_adapters
    with pytest.raises(TypeError, match="TransformersEngine takes no LoRA adapters"):
        handover.publish(AdapterWeights({"a": torch.zeros(1)}, {}), version=1)
