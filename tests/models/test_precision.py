"""``dtype: auto``: bf16 only where the CPU multiplies bf16 in hardware (AMX or AVX-512 BF16), read from the
CPU's flags; an explicit dtype is never changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll_lightning.models.precision import cpu_flags, native_bf16, resolve_dtype
from roll_lightning.training.config import TrainingConfigError
from roll_lightning.training.module import AgentRLModule

ZEN3 = {"fpu", "sse2", "avx", "avx2", "fma"}  # no AVX-512 at all
ZEN4 = ZEN3 | {"avx512f", "avx512_bf16"}
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}


@pytest.mark.parametrize(("flags", "expected"), [(ZEN3, "float32"), (ZEN4, "bfloat16"), (SAPPHIRE_RAPIDS, "bfloat16")])
def test_auto_is_bf16_only_with_hardware_bf16(flags: set[str], expected: str) -> None:
    assert resolve_dtype("auto", "cpu", flags) == expected
    assert native_bf16("cpu", flags) == (expected == "bfloat16")


def test_an_explicit_dtype_is_kept_whatever_the_cpu() -> None:
    for dtype in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(dtype, "cpu", ZEN3) == resolve_dtype(dtype, "cpu", ZEN4) == dtype


def test_the_flags_come_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()  # not Linux: no flags, so auto is float32
    assert resolve_dtype("auto", "cpu", cpu_flags(tmp_path / "absent")) == "float32"


def test_the_module_accepts_auto_and_names_the_choices() -> None:
    assert AgentRLModule("tiny", dtype="auto").dtype_setting == "auto"
    with pytest.raises(TrainingConfigError, match="float32 or bfloat16 or auto"):
        AgentRLModule("tiny", dtype="bf16")
