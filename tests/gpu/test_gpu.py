"""The GPU suite (``pytest -m gpu``, or ``python bench/gpu_check.py`` for the table): each check of
roll_lightning/checks/gpu.py as a test. Skipped, with the reason, where no CUDA device is visible: this project's
CI machines have none, so tests/checks/test_gpu_check.py runs the same functions on the CPU where they can run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll_lightning.checks import gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (run bench/gpu_check.py on a GPU)"),
]


@pytest.fixture(scope="module")
def model() -> Path:
    from roll_lightning.models.resolve import resolve_model

    return resolve_model("tiny")


def test_cuda_is_visible() -> None:
    assert gpu.check_cuda().status == "PASS"


def test_vllm_generates_sleeps_wakes_and_syncs(model: Path) -> None:
    outcome = gpu.check_vllm(model)
    assert outcome.status == "PASS", outcome.detail


def test_fsdp2_over_nccl_matches_one_process(model: Path) -> None:
    outcome = gpu.check_fsdp2(model)
    if outcome.status == "SKIP":
        pytest.skip(outcome.detail)
    assert outcome.status == "PASS", outcome.detail


def test_bf16_mixed_precision_trains(model: Path) -> None:
    outcome = gpu.check_bf16(model)
    assert outcome.status == "PASS", outcome.detail


def test_the_main_command_with_the_gpu_overlay_runs_three_steps() -> None:
    outcome = gpu.check_fit()
    assert outcome.status == "PASS", outcome.detail


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="partial overlap needs a second GPU to generate on")
def test_partial_overlap_frees_the_training_gpu_for_each_update() -> None:
    outcome = gpu.check_partial()
    assert outcome.status == "PASS", outcome.detail


def test_pictures_through_vllm_and_the_vl_fit() -> None:
    outcome = gpu.check_vision()
    assert outcome.status == "PASS", outcome.detail
