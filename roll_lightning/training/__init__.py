"""Training internals: typed configs, forward passes over rollout rows, micro-batching, FSDP2 sharding."""

from roll_lightning.training.config import AlgorithmConfig, LoraConfig, OptimConfig, TrainingConfigError

__all__ = ["AlgorithmConfig", "LoraConfig", "OptimConfig", "TrainingConfigError"]
