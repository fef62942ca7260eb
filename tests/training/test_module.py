"""`AgentRLModule` on the tiny model: an update moves probability toward advantaged replies, and the gradient
does not depend on how a mini-batch is split into micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from support.trainers import quiet_trainer

from roll_lightning.checks.handmade import GOOD, FixedBatches, handmade_batch, reply_logprob
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.training import AlgorithmConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.module import AgentRLModule


def fit(
    module: AgentRLModule, batch: RolloutBatch, tmp_path: Path, rollout_steps: int = 1, ckpt_path: Path | None = None
) -> L.Trainer:
    module.rollout_steps_limit = rollout_steps
    trainer = quiet_trainer(tmp_path, max_steps=-1)
    trainer.fit(module, datamodule=FixedBatches(batch), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize(
    "algorithm",
    [
        AlgorithmConfig(estimator="grpo", loss="ppo"),
        AlgorithmConfig(estimator="grpo", loss="gspo"),
        AlgorithmConfig(estimator="grpo", loss="gspo", gspo_per_turn=True),
        AlgorithmConfig(estimator="ppo-gae", loss="ppo", value_coef=0.5),
        AlgorithmConfig(estimator="grpo", loss="ppo", kl_coef=0.1, entropy_coef=0.01, ppo_epochs=2, mini_batches=2),
    ],
    ids=["grpo-ppo", "grpo-gspo", "grpo-gspo-per-turn", "ppo-gae", "grpo-kl-entropy-epochs"],
)
def test_an_update_raises_the_probability_of_advantaged_replies(
    model_dir: Path, tokenizer: Any, tmp_path: Path, algorithm: AlgorithmConfig
) -> None:
    batch = handmade_batch(model_dir, tokenizer)
    module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-4))
    module.configure_model()
    good = [i for i in range(len(batch)) if GOOD in tokenizer.decode(batch.input_ids[i])]
    bad = [i for i in range(len(batch)) if i not in good]
    before = [reply_logprob(module.actor, batch, i) for i in range(len(batch))]
    trainer = fit(module, batch, tmp_path, rollout_steps=3 if algorithm.estimator == "ppo-gae" else 1)
    after = [reply_logprob(module.actor, batch, i) for i in range(len(batch))]
    assert all(after[i] > before[i] for i in good)
    if algorithm.estimator == "ppo-gae":
        # the critic starts at 0, so score-0 replies start with advantage ~0: they lose only relative ground
        assert min(after[i] - before[i] for i in good) > max(after[i] - before[i] for i in bad)
    else:
        assert all(after[i] < before[i] for i in bad)
    logged = trainer.callback_metrics
    if algorithm.estimator != "ppo-gae":  # (ppo-gae runs 3 steps on the same batch: the policy has moved on)
        assert abs(float(logged["train/logprob_gap"])) < 1e-4  # trainer and "engine" agree at temperature 1
    assert module.steps_done == (3 if algorithm.estimator == "ppo-gae" else 1)
    if algorithm.estimator == "ppo-gae":
        assert "train/value_loss" in logged


def test_the_policy_loss_falls_over_repeated_updates_on_one_batch(
    model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    batch = handmade_batch(model_dir, tokenizer)
    module = AgentRLModule(
        str(model_dir),
        algorithm=AlgorithmConfig(recompute_old_logprobs=False, ppo_epochs=4, mini_batches=1),
        optim=OptimConfig(lr=1e-4),
    )
    losses: list[float] = []
    original = module._micro_loss

    def recording(*args: Any, **kwargs: Any) -> Any:
        loss, metrics = original(*args, **kwargs)
        losses.append(float(metrics["pg_loss"]))
        return loss, metrics

    module._micro_loss = recording  # type: ignore[method-assign]
    trainer = fit(module, batch, tmp_path)
    assert len(losses) >= 4 and losses[-1] < losses[0]
    # the engine's log-probs were used: the gap is measured on the first (pre-update) optimiser step
    assert float(trainer.callback_metrics["train/logprob_gap"]) < 1e-4


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"micro_batching": "fixed", "micro_batch_size": 8}, {"micro_batching": "fixed", "micro_batch_size": 1}),
        (
            {"micro_batching": "fixed", "micro_batch_size": 8},
            {"micro_batching": "token_budget", "max_tokens_per_micro": 40},
        ),
        (
            {"micro_batching": "fixed", "micro_batch_size": 8, "loss": "gspo"},
            {"micro_batching": "token_budget", "max_tokens_per_micro": 40, "loss": "gspo"},
        ),
        (
            {"micro_batch_size": 8, "micro_batching": "fixed", "aggregation": "seq-mean-token-mean"},
            {"micro_batch_size": 3, "micro_batching": "fixed", "aggregation": "seq-mean-token-mean"},
        ),
        (  # each micro-batch divided its entropy and KL by its own tokens, and the policy term by its own rows
            {"micro_batch_size": 8, "micro_batching": "fixed", "loss": "gspo", "kl_coef": 0.1, "entropy_coef": 0.01},
            {
                "micro_batching": "token_budget",
                "max_tokens_per_micro": 40,
                "loss": "gspo",
                "kl_coef": 0.1,
                "entropy_coef": 0.01,
            },
        ),  # fmt: skip
        (  # each micro-batch divided by its own trimmed width
            {"micro_batch_size": 8, "micro_batching": "fixed", "aggregation": "seq-mean-token-sum-norm"},
            {"micro_batching": "token_budget", "max_tokens_per_micro": 40, "aggregation": "seq-mean-token-sum-norm"},
        ),
    ],
    ids=["fixed-8-vs-1", "fixed-vs-token-budget", "gspo", "seq-mean", "gspo-kl-entropy", "token-sum-norm"],
)
def test_micro_batching_and_accumulation_give_the_same_update(
    model_dir: Path, tokenizer: Any, tmp_path: Path, a: dict[str, Any], b: dict[str, Any]
) -> None:
    batch = handmade_batch(model_dir, tokenizer)
    params = []
    for i, settings in enumerate((a, b)):
        module = AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(**settings), optim=OptimConfig(lr=1e-4))
        fit(module, batch, tmp_path / str(i))
        params.append(torch.cat([p.detach().flatten() for p in module.actor.parameters()]))
    original = torch.cat([p.flatten() for p in AgentRLModule._load(model_dir).parameters()])
    assert not torch.allclose(params[0], original)  # the update did something
    torch.testing.assert_close(params[0], params[1], atol=2e-6, rtol=1e-5)


def test_resume_continues_the_optimizer_and_the_schedule(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Two rollout steps straight equal one step, a checkpoint, a new process-like module, and one more step."""
    batch = handmade_batch(model_dir, tokenizer)
    optim = OptimConfig(lr=1e-4, warmup_steps=4)  # the LR differs every step: the schedule state must carry over

    def new() -> AgentRLModule:
        return AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(), optim=optim)

    straight = new()
    fit(straight, batch, tmp_path / "straight", rollout_steps=2)
    first = new()
    trainer = fit(first, batch, tmp_path / "first", rollout_steps=1)
    trainer.save_checkpoint(tmp_path / "step1.ckpt")
    resumed = new()
    fit(resumed, batch, tmp_path / "resumed", rollout_steps=2, ckpt_path=tmp_path / "step1.ckpt")
    assert resumed.steps_done == straight.steps_done == 2
    for (name, a), b in zip(straight.actor.named_parameters(), resumed.actor.parameters(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    lrs = [m.trainer.optimizers[0].param_groups[0]["lr"] for m in (straight, resumed)]
    assert lrs[0] == lrs[1] == pytest.approx(1e-4 * 3 / 4)


def test_bf16_compute_keeps_float32_weights(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    batch = handmade_batch(model_dir, tokenizer)
    module = AgentRLModule(str(model_dir), dtype="bfloat16", optim=OptimConfig(lr=1e-4))
    trainer = fit(module, batch, tmp_path)
    assert all(p.dtype == torch.float32 for p in module.actor.parameters())
    assert torch.isfinite(torch.tensor(float(trainer.callback_metrics["train/loss"])))
    with pytest.raises(TrainingConfigError, match="model.dtype"):
        AgentRLModule(str(model_dir), dtype="float16").configure_model()


def test_gigpo_needs_step_rows(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    module = AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(estimator="gigpo"))
    with pytest.raises(ValueError, match="layout: step"):
        fit(module, handmade_batch(model_dir, tokenizer), tmp_path)
    step_rows = handmade_batch(model_dir, tokenizer, layout="step")
    fit(AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(estimator="gigpo")), step_rows, tmp_path / "ok")


def test_bad_algorithm_settings_name_the_key() -> None:
    with pytest.raises(TrainingConfigError, match="model.algorithm.dual_clip"):
        AlgorithmConfig(dual_clip=0.5)
    with pytest.raises(TrainingConfigError, match="model.optim.lr"):
        OptimConfig(lr=0)


@pytest.mark.parametrize("mode", ["none", "truncate", "mask"])
def test_the_off_policy_correction_is_measured_and_logged_every_step(
    model_dir: Path, tokenizer: Any, tmp_path: Path, mode: str
) -> None:
    """The hand-made batch's behaviour log-probs are the model's own: every weight is 1 (nothing truncated or
    masked), and the update is the uncorrected one."""
    from roll_lightning.training.config import CorrectionConfig

    batch = handmade_batch(model_dir, tokenizer)
    params = []
    for i, correction in enumerate((CorrectionConfig(), CorrectionConfig(mode=mode, level="sequence"))):  # type: ignore[arg-type]
        algorithm = AlgorithmConfig(correction=correction, recompute_old_logprobs=True)
        module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-4))
        trainer = fit(module, batch, tmp_path / str(i))
        params.append(torch.cat([p.detach().flatten() for p in module.actor.parameters()]))
    logged = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/is_")}
    assert logged["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert logged["train/is_weight_max"] == pytest.approx(1.0, abs=1e-4)
    assert logged["train/is_truncated_frac"] == logged["train/is_masked_frac"] == 0.0
    # Adam's first step moves each weight by about lr (1e-4) times its gradient's sign; weights of 1 +- 1e-7 (the
    # recomputed log-probs' rounding) move a few near-zero gradients, by up to 2e-6 on Intel's kernels: a tenth of
    # one step is the bound. A correction that turned a gradient's sign would move that weight by 2e-4.
    torch.testing.assert_close(params[0], params[1], atol=1e-5, rtol=1e-5)


def test_one_step_per_batch_takes_the_old_log_probs_from_its_own_forward(
    model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """With one optimiser step per batch no no-grad pass runs before the update (the update's forward, detached,
    is the old policy), and the update equals the one made with an explicit pass's log-probs (here the batch's,
    which the trainer's equal at temperature 1)."""
    batch = handmade_batch(model_dir, tokenizer)
    params, forwards = [], []
    for i, recompute in enumerate((True, False)):
        algorithm = AlgorithmConfig(recompute_old_logprobs=recompute, micro_batching="fixed", micro_batch_size=2)
        assert algorithm.old_logprobs_from_update is recompute
        module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-4))
        module.configure_model()
        calls: list[bool] = []
        module.actor.register_forward_hook(lambda *_, calls=calls: calls.append(torch.is_grad_enabled()))
        fit(module, batch, tmp_path / str(i))
        params.append(torch.cat([p.detach().flatten() for p in module.actor.parameters()]))
        forwards.append(calls)
    assert forwards[0] == [True] * ((len(batch) + 1) // 2)  # the micro-batches' forwards alone, all with grad
    torch.testing.assert_close(params[0], params[1], atol=2e-6, rtol=1e-5)
    assert not AlgorithmConfig(mini_batches=2).old_logprobs_from_update


def test_a_sampler_far_from_the_trainer_is_reported_once(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """Behaviour log-probs 0.5 nats below the trainer's on every reply token (as from other weights): the gap is
    logged as such, and one warning names it."""
    import dataclasses

    from roll_lightning.training.module import LOGPROB_GAP_WARNING

    batch = handmade_batch(model_dir, tokenizer)
    shifted = batch.behaviour_logprobs - 0.5 * batch.response_mask
    batch = dataclasses.replace(batch, behaviour_logprobs=shifted)
    module = AgentRLModule(str(model_dir), optim=OptimConfig(lr=1e-4))
    with pytest.warns(UserWarning, match=r"train/logprob_gap is 0\.5\d\d nats per reply token") as caught:
        trainer = fit(module, batch, tmp_path, rollout_steps=2)
    gap = float(trainer.callback_metrics["train/logprob_gap"])
    assert abs(gap - 0.5) < 0.1 and gap > LOGPROB_GAP_WARNING
    assert sum("logprob_gap" in str(w.message) for w in caught) == 1


def test_under_bf16_autocast_a_forward_after_an_optimiser_step_sees_the_stepped_weights(
    model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """The update runs in one bf16 autocast region, whose cache keeps one bf16 copy of each weight; a step changes
    the weights in place, so the copies must go with it. Seen through `max_update_kl`'s forward after the step: its
    KL is the stepped policy's (a fresh bf16 forward of the trained weights), not the policy before the step's."""
    from roll_lightning.training.forward import policy_forward
    from roll_lightning.training.update_guard import update_kl

    batch = handmade_batch(model_dir, tokenizer)
    before = AgentRLModule._load(model_dir)
    algorithm = AlgorithmConfig(max_update_kl=1e9, recompute_old_logprobs=False)
    module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-3), dtype="bfloat16")
    trainer = fit(module, batch, tmp_path)

    def kl(actor: Any) -> float:  # the guard's own measure, on a fresh bf16 forward
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = policy_forward(actor, batch, 1.0)
        total, count = update_kl(batch.behaviour_logprobs, logp, batch.response_mask)
        return total / count

    logged, stepped, stale = float(trainer.callback_metrics["train/update_kl"]), kl(module.actor), kl(before)
    assert abs(stepped - stale) > 10 * 0.05 * stepped, (stepped, stale)  # the step moved the policy, measurably
    assert logged == pytest.approx(stepped, rel=0.05), (logged, stepped, stale)


def test_an_update_that_moves_the_policy_too_far_is_undone(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """`max_update_kl`: the KL logged is the policy's own after the update (k3 of the reply tokens against the
    sampling log-probs); under a bound it passes the update is kept, over it the weights and AdamW's moments are
    exactly as before the update, and the next update starts from there."""
    from roll_lightning.training.forward import policy_forward

    batch = handmade_batch(model_dir, tokenizer)
    original = [p.detach().clone() for p in AgentRLModule._load(model_dir).parameters()]

    def guarded(bound: float, rollout_steps: int, folder: str) -> tuple[AgentRLModule, dict[str, float]]:
        algorithm = AlgorithmConfig(max_update_kl=bound, recompute_old_logprobs=False)
        module = AgentRLModule(str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-3))
        trainer = fit(module, batch, tmp_path / folder, rollout_steps=rollout_steps)
        return module, {k: float(v) for k, v in trainer.callback_metrics.items()}

    kept, logged = guarded(1e9, 1, "kept")
    assert logged["train/update_undone"] == 0.0
    assert any(not torch.equal(p, q) for p, q in zip(kept.actor.parameters(), original, strict=True))
    with torch.no_grad():
        new_logp, _ = policy_forward(kept.actor, batch, 1.0)
    mask = batch.response_mask.bool()
    log_r = (new_logp - batch.behaviour_logprobs)[mask]
    assert logged["train/update_kl"] == pytest.approx(float((log_r.exp() - 1 - log_r).mean()), rel=1e-4)
    assert logged["train/update_kl"] > 1e-6

    undone, logged = guarded(logged["train/update_kl"] / 2, 2, "undone")  # every update goes as far as that one
    assert logged["train/update_undone"] == 1.0 and logged["train/update_kl"] > 0
    assert undone.steps_done == 2
    for p, q in zip(undone.actor.parameters(), original, strict=True):
        assert torch.equal(p, q)
    assert not undone.trainer.optimizers[0].state  # no AdamW moments kept from either update
