"""`quiet_trainer`: the Lightning Trainer the tests build, on CPU with nothing printed or logged;
`checkpointing_trainer`: the same with the CLI's checkpointing and a logger of the test's choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L

from roll_lightning.checkpoints import ChecksummedCheckpointIO, StepCheckpoint


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


def checkpointing_trainer(root: Path, logger: Any, *callbacks: L.Callback) -> L.Trainer:
    """The CLI's checkpointing (a `StepCheckpoint`, `ChecksummedCheckpointIO`) with ``logger`` (or False)."""
    return L.Trainer(
        accelerator="cpu", devices=1, default_root_dir=root, logger=logger, max_steps=-1, max_epochs=-1,
        callbacks=[StepCheckpoint(), *callbacks], plugins=[ChecksummedCheckpointIO()],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
