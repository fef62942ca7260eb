"""`EngineConfig` (``data.engine``): which engine generates, and how; below the engines, which build from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from roll_lightning.models.precision import resolve_dtype
from roll_lightning.rollout.engines.placement import device_rule
from roll_lightning.settings import ConfigError, check, choice

# data.engine.kind -> the engine class, imported only when chosen (vLLM is heavy); each builds its replicas from
# `EngineConfig` (`from_settings`). A new engine is its file, its line here and its extra in pyproject.toml.
ENGINES: dict[str, str] = {
    "transformers": "roll_lightning.rollout.engines.transformers_engine:TransformersEngine",
    "vllm": "roll_lightning.rollout.engines.vllm_engine:VLLMEngine",
}
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
        dtype: ``float32`` (on CPUs, keeps engine and trainer log-probs equal), ``bfloat16``, ``float16``, ``auto``
            (bf16 where the replica's device computes it in hardware, else float32), or null: the trainer's
            (``model.dtype``; float32 outside the CLI).
        max_batch_size: requests per batch (vllm: ``max_num_seqs``).
        max_model_len: vllm: longest prompt + reply (default: the model's).
        kv_cache_gib: vllm on CPU: KV-cache size.
        gpu_memory_utilization: vllm on GPU: share of GPU memory it may take.
        enable_prefix_caching: vllm: reuse the KV cache of shared prefixes.
        turn_cache_gib: transformers: memory for each conversation's keys/values kept between its turns, so a
            turn prefills only its new tokens (least recently used evicted first; emptied at a weight load; 0: off).
        seed: sampling seed (replica i uses seed + i).
        max_lora_rank: vllm: largest LoRA rank served (0 = off); linked from ``model.lora.rank``.
    """

    kind: EngineKind = "auto"
    replicas: int = 1
    device: str = "auto"
    devices: list[str] | None = None
    dtype: Literal["float32", "bfloat16", "float16", "auto"] | None = None
    max_batch_size: int = 64
    max_model_len: int | None = None
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.5
    enable_prefix_caching: bool = True
    turn_cache_gib: float = 1.0
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
            "turn_cache_gib": (self.turn_cache_gib >= 0, ">= 0 (0: off)"),
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

    def weights_dtype(self, device: str) -> str:
        """The dtype of a replica's weights on ``device`` (``cpu``, ``cuda:N``): ``dtype`` (``auto`` resolved for
        that device), else float32."""
        return resolve_dtype(self.dtype or "float32", device.partition(":")[0])
