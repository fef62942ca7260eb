"""Model helpers: built-in model names (`resolve_model`) and tiny random models built offline."""

from __future__ import annotations

from typing import Any

__all__ = ["build_tiny_model", "resolve_model", "tiny_model"]


def __getattr__(name: str) -> Any:
    # lazy: runpy warns if `python -m roll_lightning.models.tiny` finds the module pre-imported
    if name == "resolve_model":
        from roll_lightning.models.resolve import resolve_model

        return resolve_model
    if name in __all__:
        from roll_lightning.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
