"""The benchmarks' tiny random models: built once into a shared cache and reused across runs.

``ROLL_BENCH_MODELS`` moves the cache (default ``/tmp/roll_lightning_bench_models``). Imports torch, so a
benchmark whose parent process stays light imports this where it builds the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from roll_lightning.models.tiny import tiny_model

MODEL_CACHE = Path(os.environ.get("ROLL_BENCH_MODELS", "/tmp/roll_lightning_bench_models"))


def bench_tiny_model(**sizes: Any) -> Path:
    """The cached tiny model of these sizes (`roll_lightning.models.tiny.tiny_model`'s arguments), seed 0."""
    return tiny_model(MODEL_CACHE, seed=0, **sizes)
