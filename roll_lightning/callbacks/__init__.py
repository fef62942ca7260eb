"""Callbacks a config adds: trajectory dumps, progress, the end summary, the dashboard. The step's own handover
(engine sleep, weight sync) is no callback: `AgentRLModule.training_step` asks the rollout for it."""

from roll_lightning.callbacks.dashboard import HeadlineDashboard
from roll_lightning.callbacks.progress import RunProgress
from roll_lightning.callbacks.summary import RunSummary
from roll_lightning.callbacks.trajectories import TrajectoryDump

__all__ = ["HeadlineDashboard", "RunProgress", "RunSummary", "TrajectoryDump"]
