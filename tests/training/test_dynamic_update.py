"""Updates under dynamic sampling: batch adjust modes, and no update spent on a batch without signal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from test_module import fit

from roll_lightning.checks.handmade import handmade_batch
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.training import AlgorithmConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.batch_adjust import adjuster
from roll_lightning.training.module import AgentRLModule


@given(
    mode=st.sampled_from(["none", "copy", "delete", "auto", "random_sample"]),
    n=st.integers(1, 200),
    d=st.integers(1, 16),
    seed=st.integers(0, 2**31),
)
@example(mode="random_sample", n=3, d=4, seed=0)  # found by hypothesis: 4 draws from 3 rows left row 1 out
def test_every_mode_leaves_rows_that_split_into_the_mini_batches(mode: str, n: int, d: int, seed: int) -> None:
    rows = adjuster(mode)(n, d, torch.Generator().manual_seed(seed))
    assert len(rows) >= d and int(rows.min()) >= 0 and int(rows.max()) < n
    kept = set(rows.tolist())
    if mode == "none":
        assert rows.tolist() == list(range(n)) if n >= d else len(rows) == d
    else:
        assert len(rows) % d == 0
    if mode == "copy" or n < d:
        assert kept == set(range(n)) and len(rows) - n < d, "copy keeps every row and adds fewer than d"
    if mode == "delete" and n >= d:
        assert len(rows) == len(kept) == n - n % d, "delete drops the remainder, no duplicates"
    if mode in ("auto", "random_sample") and n >= d:
        assert abs(len(rows) - n) <= d / 2, "the nearest multiple"


def flat(batch: RolloutBatch) -> RolloutBatch:
    """The same batch with every reward 0: each group's members scored the same."""
    for name in ("scores", "step_scores", "episode_scores"):
        setattr(batch, name, torch.zeros_like(getattr(batch, name)))
    return batch


def test_a_batch_without_signal_is_not_trained_on(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    module = AgentRLModule(
        str(model_dir), algorithm=AlgorithmConfig(ppo_epochs=2, mini_batches=2), optim=OptimConfig(lr=1e-3)
    )
    trainer = fit(module, flat(handmade_batch(model_dir, tokenizer)), tmp_path, rollout_steps=2)
    original = AgentRLModule._load(model_dir).state_dict()
    assert all(torch.equal(t, original[k]) for k, t in module.actor.state_dict().items()), "no weight moved"
    optimizer = trainer.optimizers[0]
    assert all(not optimizer.state[p] for p in module.actor.parameters()), "no AdamW moment was touched"
    assert trainer.global_step == 2 * 2 * 2, "the steps still count (checkpoints, resume and schedule go on)"
    assert module.steps_done == 2
    assert float(trainer.callback_metrics["train/update_skipped"]) == 1.0
    assert float(trainer.callback_metrics["train/zero_advantage_share"]) == 1.0


@pytest.mark.parametrize("algorithm", [{"kl_coef": 0.1}, {"entropy_coef": 0.01}], ids=["kl", "entropy"])
def test_a_batch_without_advantage_still_trains_its_other_terms(
    model_dir: Path, tokenizer: Any, tmp_path: Path, algorithm: dict[str, float]
) -> None:
    module = AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(**algorithm), optim=OptimConfig(lr=1e-3))
    trainer = fit(module, flat(handmade_batch(model_dir, tokenizer)), tmp_path)
    assert float(trainer.callback_metrics["train/update_skipped"]) == 0.0
    if "entropy_coef" in algorithm:  # KL to an identical reference has zero gradient at the first step
        original = AgentRLModule._load(model_dir).state_dict()
        assert any(not torch.equal(t, original[k]) for k, t in module.actor.state_dict().items())


@pytest.mark.parametrize("mode", ["copy", "delete", "auto", "random_sample"])
def test_adjusted_batches_train_with_the_configured_steps(
    model_dir: Path, tokenizer: Any, tmp_path: Path, mode: str
) -> None:
    batch = handmade_batch(model_dir, tokenizer, groups=2)
    batch = batch.select(list(range(7)))  # 7 rows for 3 mini-batches: copy -> 9, delete -> 6, auto/random -> 6
    module = AgentRLModule(
        str(model_dir), algorithm=AlgorithmConfig(mini_batches=3, batch_adjust=mode), optim=OptimConfig(lr=1e-3)
    )
    trainer = fit(module, batch, tmp_path)
    assert trainer.global_step == 3
    assert float(trainer.callback_metrics["train/rows"]) == (9 if mode == "copy" else 6)


def test_an_unknown_batch_adjust_mode_names_the_key() -> None:
    with pytest.raises(TrainingConfigError, match="model.algorithm.batch_adjust"):
        AlgorithmConfig(batch_adjust="pad")  # type: ignore[arg-type]
