"""`data.engine.kind: auto`: vllm where it is installed, except for small models on a CPU (the measured rule)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from roll_lightning.models.resolve import parameter_count
from roll_lightning.rollout.engines.factory import CPU_VLLM_MIN_PARAMS, pick_engine_kind


def test_parameter_count_reads_the_safetensors_headers(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert parameter_count(model_dir) == sum(p.numel() for p in model.parameters())


def test_parameter_count_of_a_folder_without_safetensors_is_unknown(tmp_path: Path) -> None:
    assert parameter_count(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"\x05")  # truncated: unreadable, not a crash
    assert parameter_count(tmp_path) is None


def header_only_weights(folder: Path, rows: int, cols: int) -> Path:
    """A safetensors file with one ``rows x cols`` tensor whose data is a hole (sparse: no disk, never read)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [0, rows * cols * 4]}}).encode()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "model.safetensors").open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + rows * cols * 4)
    return folder


def test_small_models_on_a_cpu_get_transformers(model_dir: Path) -> None:
    assert pick_engine_kind("cpu", model_dir, vllm_installed=True) == "transformers"


@pytest.mark.parametrize(
    ("device", "vllm_installed", "size", "kind"),
    [
        ("cpu", True, CPU_VLLM_MIN_PARAMS, "vllm"),
        ("cpu", True, CPU_VLLM_MIN_PARAMS - 1, "transformers"),
        ("cpu", False, CPU_VLLM_MIN_PARAMS, "transformers"),
        ("cuda", True, 1, "vllm"),  # on a GPU vLLM's batching wins at any size
        ("cuda:1", False, CPU_VLLM_MIN_PARAMS, "transformers"),
    ],
)
def test_the_rule(tmp_path: Path, device: str, vllm_installed: bool, size: int, kind: str) -> None:
    folder = header_only_weights(tmp_path / "model", 1, size)
    assert pick_engine_kind(device, folder, vllm_installed=vllm_installed) == kind


def test_each_engine_kind_is_a_registry_entry_that_builds_itself(model_dir: Path) -> None:
    """`data.engine.kind` takes the registry's names (and ``auto``); a kind's class builds its replicas from the
    config, each with its own seed."""
    import asyncio
    from typing import get_args, get_type_hints

    from roll_lightning.rollout.engines.config import ENGINES
    from roll_lightning.rollout.engines.factory import EngineConfig, build_engine, engine_class
    from roll_lightning.rollout.engines.router import EngineRouter
    from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

    assert set(get_args(get_type_hints(EngineConfig)["kind"])) == {"auto", *ENGINES}
    assert {kind: engine_class(kind).name for kind in ENGINES} == {kind: kind for kind in ENGINES}
    router = build_engine(EngineConfig(kind="transformers", replicas=2, device="cpu", seed=7), model_dir)
    assert isinstance(router, EngineRouter)
    assert [type(r) for r in router.replicas] == [TransformersEngine, TransformersEngine]
    assert [r._generator_seed for r in router.replicas] == [7, 8]
    asyncio.run(router.close())
