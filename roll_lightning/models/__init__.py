"""Model helpers. `tiny` builds small random chat models offline, for tests and smoke runs."""

from __future__ import annotations

from typing import Any

__all__ = ["build_tiny_model", "resolve_model", "tiny_model"]


def __getattr__(name: str) -> Any:
    # Lazy, so `python -m roll_lightning.models.tiny` does not find the module pre-imported (runpy warns then).
    if name == "resolve_model":
        from roll_lightning.models.resolve import resolve_model

        return resolve_model
    if name in __all__:
        from roll_lightning.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
