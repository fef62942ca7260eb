"""Every numeric setting is range-checked where it is defined, and the error names the key, the rule and the value."""

from __future__ import annotations

import re
from typing import Any

import pytest

from roll_lightning.rollout.config import RolloutConfigError
from roll_lightning.rollout.datamodule import EvalConfig
from roll_lightning.rollout.engines.factory import EngineConfig, EngineConfigError
from roll_lightning.training import AlgorithmConfig, OptimConfig, TrainingConfigError

CASES: list[tuple[type, dict[str, Any], type, str]] = [
    (AlgorithmConfig, {"gamma": 1.5}, TrainingConfigError, "model.algorithm.gamma must be in [0, 1], got 1.5"),
    (AlgorithmConfig, {"lam": -0.1}, TrainingConfigError, "model.algorithm.lam must be in [0, 1], got -0.1"),
    (AlgorithmConfig, {"gigpo_gamma": 2.0}, TrainingConfigError, "model.algorithm.gigpo_gamma must be in [0, 1]"),
    (AlgorithmConfig, {"clip_low": -0.2}, TrainingConfigError, "model.algorithm.clip_low must be >= 0, or null"),
    (AlgorithmConfig, {"clip_high": -1.0}, TrainingConfigError, "model.algorithm.clip_high must be >= 0, or null"),
    (AlgorithmConfig, {"entropy_coef": -0.01}, TrainingConfigError, "model.algorithm.entropy_coef must be >= 0"),
    (AlgorithmConfig, {"value_coef": -1.0}, TrainingConfigError, "model.algorithm.value_coef must be >= 0"),
    (AlgorithmConfig, {"value_clip": -0.2}, TrainingConfigError, "model.algorithm.value_clip must be >= 0"),
    (AlgorithmConfig, {"step_weight": -1.0}, TrainingConfigError, "model.algorithm.step_weight must be >= 0"),
    (AlgorithmConfig, {"max_grad_norm": -1.0}, TrainingConfigError, "model.algorithm.max_grad_norm must be >= 0"),
    (AlgorithmConfig, {"ppo_epochs": 0}, TrainingConfigError, "model.algorithm.ppo_epochs must be >= 1, got 0"),
    (AlgorithmConfig, {"dual_clip": 0.5}, TrainingConfigError, "model.algorithm.dual_clip must be > 1, or null"),
    (AlgorithmConfig, {"gamma": float("nan")}, TrainingConfigError, "model.algorithm.gamma must be in [0, 1]"),
    (OptimConfig, {"lr": 0.0}, TrainingConfigError, "model.optim.lr must be > 0, got 0.0"),
    (OptimConfig, {"critic_lr": 0.0}, TrainingConfigError, "model.optim.critic_lr must be > 0, or null"),
    (OptimConfig, {"weight_decay": -0.1}, TrainingConfigError, "model.optim.weight_decay must be >= 0"),
    (OptimConfig, {"betas": (0.9, 1.0)}, TrainingConfigError, "model.optim.betas must be two numbers in [0, 1)"),
    (OptimConfig, {"eps": 0.0}, TrainingConfigError, "model.optim.eps must be > 0"),
    (OptimConfig, {"warmup_steps": -1}, TrainingConfigError, "model.optim.warmup_steps must be >= 0, got -1"),
    (OptimConfig, {"total_steps": 0}, TrainingConfigError, "model.optim.total_steps must be >= 1, got 0"),
    (OptimConfig, {"min_lr_ratio": 1.5}, TrainingConfigError, "model.optim.min_lr_ratio must be in [0, 1]"),
    (EngineConfig, {"max_batch_size": 0}, EngineConfigError, "data.engine.max_batch_size must be >= 1, got 0"),
    (EngineConfig, {"max_model_len": 0}, EngineConfigError, "data.engine.max_model_len must be >= 1, or null"),
    (EngineConfig, {"kv_cache_gib": 0.0}, EngineConfigError, "data.engine.kv_cache_gib must be > 0"),
    (EngineConfig, {"gpu_memory_utilization": 1.5}, EngineConfigError, "gpu_memory_utilization must be in (0, 1]"),
    (EngineConfig, {"replicas": 0}, EngineConfigError, "data.engine.replicas must be >= 1, got 0"),
    (EvalConfig, {"episodes": 0}, RolloutConfigError, "data.evaluation.episodes must be >= 1, got 0"),
    (EvalConfig, {"temperature": -1.0}, RolloutConfigError, "data.evaluation.temperature must be >= 0"),
    (EvalConfig, {"max_new_tokens": 0}, RolloutConfigError, "data.evaluation.max_new_tokens must be >= 1, or null"),
]


@pytest.mark.parametrize(("config", "values", "error", "message"), CASES, ids=[m.split(" ")[0] for *_, m in CASES])
def test_an_out_of_range_value_is_refused_naming_the_key(
    config: type, values: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        config(**values)


def test_temperature_zero_says_why_training_cannot_use_it() -> None:
    with pytest.raises(TrainingConfigError, match=r"temperature must be > 0, got 0\.0: it is data\.rollout\..*greedy"):
        AlgorithmConfig(temperature=0.0)


def test_the_defaults_and_the_edges_of_each_range_are_accepted() -> None:
    AlgorithmConfig()
    AlgorithmConfig(gamma=0.0, lam=1.0, clip_low=0.0, entropy_coef=0.0, max_grad_norm=0.0, value_clip=0.0)
    OptimConfig()
    OptimConfig(betas=(0.0, 0.0), min_lr_ratio=1.0, warmup_steps=0, total_steps=1)
    EngineConfig(gpu_memory_utilization=1.0, max_model_len=1)
    EvalConfig(episodes=1, temperature=0.0, max_new_tokens=1)
