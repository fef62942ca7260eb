"""`quiet_trainer`: the Lightning Trainer the tests build, on CPU with nothing printed or logged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L


def quiet_trainer(root: Path, **options: Any) -> L.Trainer:
    """One CPU device, no logger, progress bar, model summary or checkpoint callback; ``options`` add or override
    Trainer arguments (``max_steps``, ``callbacks``, ``devices``, ``strategy``, ...)."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "default_root_dir": root,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
    }
    return L.Trainer(**{**settings, **options})
