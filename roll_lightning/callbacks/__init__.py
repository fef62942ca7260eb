"""Callbacks a config adds: trajectory dumps and what the terminal shows (progress, the summary at the end, the
headline dashboard). The module's own callbacks (weight sync, GPU handoff) live with it in `roll_lightning.training`
and are re-exported here."""

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
