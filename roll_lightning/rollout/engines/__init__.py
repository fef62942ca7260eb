"""Generation engines behind one async interface (`GenerationEngine`); `build_engine` picks one by name."""

from roll_lightning.rollout.engines.base import (
    EngineClosed,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingParams,
)
from roll_lightning.rollout.engines.router import EngineRouter
from roll_lightning.rollout.engines.simulated import SimulatedEngine

__all__ = [
    "EngineClosed",
    "EngineRouter",
    "FinishReason",
    "Generation",
    "GenerationEngine",
    "SamplingParams",
    "SimulatedEngine",
]
