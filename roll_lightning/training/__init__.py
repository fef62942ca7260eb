"""The policy update: configs, forward passes, micro-batching, FSDP2."""

from roll_lightning.training.config import AlgorithmConfig, LoraConfig, OptimConfig, TrainingConfigError

__all__ = ["AlgorithmConfig", "LoraConfig", "OptimConfig", "TrainingConfigError"]
