"""Every numeric setting is range-checked where it is defined, and the error names the key, the rule and the value."""

from __future__ import annotations

import re
from typing import Any, get_args

import pytest

from roll_lightning.algorithms import (
    AGGREGATIONS,
    ESTIMATORS,
    GRPO,
    GSPO,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PPO,
    PPOGAE,
    GiGPO,
    Vine,
)
from roll_lightning.algorithms.aggregation import AggMode
from roll_lightning.rollout.config.rollout import RolloutConfigError
from roll_lightning.rollout.datamodule import EvalConfig
from roll_lightning.rollout.engines.factory import EngineConfig, EngineConfigError
from roll_lightning.rollout.episodes.layout import STEP, TRAJECTORY
from roll_lightning.training import AlgorithmConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.config import CorrectionConfig, EstimatorName, PolicyLossName
from roll_lightning.training.estimate import check_rows

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
    (AlgorithmConfig, {"max_update_kl": 0.0}, TrainingConfigError, "model.algorithm.max_update_kl must be > 0"),
    (AlgorithmConfig, {"ppo_epochs": 0}, TrainingConfigError, "model.algorithm.ppo_epochs must be >= 1, got 0"),
    (AlgorithmConfig, {"dual_clip": 0.5}, TrainingConfigError, "model.algorithm.dual_clip must be > 1, or null"),
    (
        AlgorithmConfig,
        {"loss": "gspo", "dual_clip": 3.0},
        TrainingConfigError,
        "dual_clip must be > 1, or null (off); it is loss: ppo's alone",
    ),
    (
        AlgorithmConfig,
        {"gspo_per_turn": True},
        TrainingConfigError,
        "model.algorithm.gspo_per_turn must be false unless loss: gspo; it is gspo's alone, got True",
    ),
    (
        AlgorithmConfig,
        {"kl_kind": "k4"},
        TrainingConfigError,
        "model.algorithm.kl_kind must be one of k1, kl, abs, k2, mse, k3, low_var_kl, got 'k4'",
    ),
    (
        AlgorithmConfig,
        {"aggregation": "sum"},
        TrainingConfigError,
        "model.algorithm.aggregation must be one of token-mean",
    ),
    (OptimConfig, {"schedule": "linear"}, TrainingConfigError, "model.optim.schedule must be one of constant, cosine"),
    (CorrectionConfig, {"mode": "clip"}, TrainingConfigError, "correction.mode must be one of none, truncate, mask"),
    (AlgorithmConfig, {"gamma": float("nan")}, TrainingConfigError, "model.algorithm.gamma must be in [0, 1]"),
    (OptimConfig, {"lr": 0.0}, TrainingConfigError, "model.optim.lr must be > 0, got 0.0"),
    (OptimConfig, {"critic_lr": 0.0}, TrainingConfigError, "model.optim.critic_lr must be > 0, or null"),
    (OptimConfig, {"weight_decay": -0.1}, TrainingConfigError, "model.optim.weight_decay must be >= 0"),
    (OptimConfig, {"betas": (0.9, 1.0)}, TrainingConfigError, "model.optim.betas must be two numbers in [0, 1)"),
    (OptimConfig, {"eps": 0.0}, TrainingConfigError, "model.optim.eps must be > 0"),
    (OptimConfig, {"warmup_steps": -1}, TrainingConfigError, "model.optim.warmup_steps must be >= 0, got -1"),
    (
        OptimConfig,
        {"total_steps": 0},
        TrainingConfigError,
        "model.optim.total_steps must be >= 1, or null (the run's length), got 0",
    ),
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


def test_each_name_is_chosen_once_into_an_object_that_declares_what_it_needs() -> None:
    assert set(get_args(EstimatorName)) == set(ESTIMATORS)  # the YAML's choices are the registry's names
    assert set(get_args(PolicyLossName)) == set(POLICY_LOSSES)
    needs = {name: (e.needs_groups, e.needs_step_rows, e.uses_critic) for name, e in ESTIMATORS.items()}
    assert needs == {
        "grpo": (True, False, False), "gigpo": (True, True, False), "ppo-gae": (False, False, True),
        "vine": (True, True, False),
    }  # fmt: skip
    gigpo = AlgorithmConfig(estimator="gigpo", gigpo_gamma=0.5, step_weight=2.0, norm_by_std=False)
    assert gigpo.advantage_estimator == GiGPO(gamma=0.5, step_weight=2.0, norm_by_std=False)
    by_turn = AlgorithmConfig(estimator="gigpo", gigpo_same_turn=True).advantage_estimator
    assert by_turn == GiGPO(same_turn=True) != GiGPO()
    batch = AlgorithmConfig(estimator="gigpo", episode_baseline="batch").advantage_estimator
    assert batch == GiGPO(episode_baseline="batch") != GiGPO()
    assert AlgorithmConfig(episode_baseline="batch").advantage_estimator == GRPO(baseline="batch")
    assert AlgorithmConfig(estimator="ppo-gae", gamma=0.9, lam=0.8).advantage_estimator == PPOGAE(gamma=0.9, lam=0.8)
    assert AlgorithmConfig(estimator="vine", gigpo_gamma=0.5).advantage_estimator == Vine(gamma=0.5)
    assert AlgorithmConfig(estimator="ppo-gae").uses_critic and not AlgorithmConfig().uses_critic


def test_the_loss_s_aggregation_and_kl_are_chosen_once_into_objects() -> None:
    assert set(get_args(AggMode)) == set(AGGREGATIONS)
    for name, aggregation in AGGREGATIONS.items():
        assert AlgorithmConfig(aggregation=name).objective.aggregation is aggregation  # type: ignore[arg-type]
    for name in ("k1", "k2", "k3", "abs"):
        assert AlgorithmConfig(kl_kind=name).objective.kl is KL_ESTIMATORS[name]  # type: ignore[arg-type]
    assert not CorrectionConfig().applied and CorrectionConfig(mode="mask").applied


def test_an_unset_clip_is_the_chosen_loss_s_own_default() -> None:
    assert AlgorithmConfig().policy_loss == PPO(clip_low=0.2, clip_high=0.2, dual_clip=None)
    assert AlgorithmConfig(loss="gspo").policy_loss == GSPO(clip_low=3e-4, clip_high=4e-4)
    assert AlgorithmConfig(loss="gspo", clip_high=1e-3).policy_loss == GSPO(clip_low=3e-4, clip_high=1e-3)
    assert AlgorithmConfig(loss="gspo", gspo_per_turn=True).policy_loss == GSPO(per_turn=True)
    assert AlgorithmConfig(dual_clip=3.0, clip_low=0.1).objective.policy == PPO(clip_low=0.1, dual_clip=3.0)


def test_group_estimators_need_groups_of_two() -> None:
    with pytest.raises(TrainingConfigError, match="grpo.*group_size >= 2"):
        check_rows(AlgorithmConfig(estimator="grpo").advantage_estimator, TRAJECTORY, group_size=1)
    check_rows(AlgorithmConfig(estimator="ppo-gae").advantage_estimator, TRAJECTORY, group_size=1)


def test_gigpo_needs_step_rows_and_names_the_key_that_gives_them() -> None:
    with pytest.raises(TrainingConfigError, match=re.escape("set data.rollout.episode.layout: step")):
        check_rows(GiGPO(), TRAJECTORY, group_size=4)
    check_rows(GiGPO(), STEP, group_size=4)
