"""Callbacks: weight sync into the engine, GPU handoff between generation and training, trajectory dumps."""

from roll_lightning.callbacks.gpu_handoff import GPUHandoff
from roll_lightning.callbacks.trajectories import TrajectoryDump
from roll_lightning.callbacks.weight_sync import WeightSync, full_state_dict

__all__ = ["GPUHandoff", "TrajectoryDump", "WeightSync", "full_state_dict"]
