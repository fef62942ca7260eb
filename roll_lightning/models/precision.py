"""``dtype: auto``: bfloat16 where the device computes it natively, float32 where bf16 would be emulated.

On a CPU without AMX or AVX-512 BF16 (an AMD Zen 3, an Intel Xeon before Cooper Lake) every bf16 matmul is
converted in software: SmolLM2's update took over 200 s in bf16 against 33 s in float32 on a Zen 3, while bf16
was 1.57x float32 on a Zen 4 and 2.25x with AMX (docs/benchmarks.md, "bf16 or float32 on a CPU without AMX").
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

DTYPES = ("float32", "bfloat16", "auto")
# /proc/cpuinfo flags of CPU instructions that compute bf16 products in hardware
NATIVE_BF16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's feature flags (empty where ``cpuinfo`` does not exist: not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16(device_type: str, flags: Iterable[str] | None = None) -> bool:
    """Whether ``device_type`` (``cpu`` or ``cuda``) multiplies bf16 in hardware; ``flags`` replaces the CPU's own."""
    if device_type == "cuda":
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device_type == "cpu":
        return bool(NATIVE_BF16_CPU_FLAGS & frozenset(cpu_flags() if flags is None else flags))
    return False


def resolve_dtype(dtype: str, device_type: str, flags: Iterable[str] | None = None) -> str:
    """``dtype`` itself, or for ``auto`` bfloat16 where `native_bf16` holds and float32 elsewhere."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(device_type, flags) else "float32"
