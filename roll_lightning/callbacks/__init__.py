"""Callbacks a config adds: trajectory dumps, progress, the end summary, the dashboard. The module's own
(weight sync, GPU handoff) live in `roll_lightning.training` and are re-exported here."""

from roll_lightning.callbacks.dashboard import HeadlineDashboard
from roll_lightning.callbacks.progress import RunProgress
from roll_lightning.callbacks.summary import RunSummary
from roll_lightning.callbacks.trajectories import TrajectoryDump
from roll_lightning.training.gpu_handoff import GPUHandoff
from roll_lightning.training.weight_sync import WeightSync, full_state_dict

__all__ = [
    "GPUHandoff",
    "HeadlineDashboard",
    "RunProgress",
    "RunSummary",
    "TrajectoryDump",
    "WeightSync",
    "full_state_dict",
]
