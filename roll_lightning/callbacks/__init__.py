"""Callbacks: weight sync into the engine, GPU handoff between generation and training, trajectory dumps, and
what the terminal shows (progress, the summary at the end)."""

from roll_lightning.callbacks.dashboard import HeadlineDashboard
from roll_lightning.callbacks.gpu_handoff import GPUHandoff
from roll_lightning.callbacks.progress import RunProgress
from roll_lightning.callbacks.summary import RunSummary
from roll_lightning.callbacks.trajectories import TrajectoryDump
from roll_lightning.callbacks.weight_sync import WeightSync, full_state_dict

__all__ = [
    "GPUHandoff",
    "HeadlineDashboard",
    "RunProgress",
    "RunSummary",
    "TrajectoryDump",
    "WeightSync",
    "full_state_dict",
]
