"""After each update the engine generates with the trainer's new weights (`AgentRLModule._publish`, through
`Handover.publish`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from support.trainers import quiet_trainer

from roll_lightning.models.tiny import tiny_model
from roll_lightning.rollout import EpisodeSettings, RolloutConfig
from roll_lightning.rollout.datamodule import EnvsConfig, EvalConfig, RolloutDataModule
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.training import AlgorithmConfig, OptimConfig
from roll_lightning.training.module import AgentRLModule


class EngineMatchesTrainer(L.Callback):
    """Before every step after the first: the engine's greedy reply and log-probs equal the actor's."""

    def __init__(self, prompt: list[int]) -> None:
        self.prompt = prompt
        self.checked: list[tuple[int, int, float]] = []
        self.replies: list[list[int]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.check(trainer, pl_module)

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer: L.Trainer, pl_module: Any) -> None:
        dm = trainer.datamodule
        reply = dm.call(dm.engine.generate(self.prompt, SamplingParams(max_new_tokens=6, temperature=0)))
        ids = torch.tensor([self.prompt + reply.token_ids])
        with torch.no_grad():
            logits = pl_module.actor(ids).logits[0, len(self.prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
        gap = float((torch.tensor(reply.logprobs) - expected).abs().max())
        self.checked.append((reply.policy_version, pl_module.steps_done, gap))
        self.replies.append(reply.token_ids)
        assert reply.token_ids[0] == int(logits[0].argmax())  # greedy agrees with the trainer's model


def _trainer(tmp_path: Path, checker: L.Callback) -> L.Trainer:
    return quiet_trainer(tmp_path, max_steps=-1, max_epochs=-1, num_sanity_val_steps=0, callbacks=[checker])


def test_engine_generates_with_the_updated_and_the_restored_weights(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """After each update; and after a checkpoint is restored by ``fit`` or ``validate`` (the engine starts from the
    model folder, so it must be brought up to the checkpoint's weights before it plays)."""
    from transformers import AutoTokenizer

    model = tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "#P_O#"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))

    def parts(steps: int) -> tuple[AgentRLModule, RolloutDataModule]:
        data = RolloutDataModule(
            str(model),
            rollout=RolloutConfig(env_id="frozenlake", group_size=2, batch_size=4, episode=episode),
            envs=EnvsConfig(endpoints="local"),
            evaluation=EvalConfig(episodes=2),
        )
        optim = OptimConfig(lr=3e-3)
        return AgentRLModule(str(model), algorithm=AlgorithmConfig(), optim=optim, rollout_steps=steps), data

    checker = EngineMatchesTrainer(prompt)
    trainer = _trainer(tmp_path, checker)
    trainer.fit(*parts(3))
    assert [(v, s) for v, s, _ in checker.checked] == [(0, 0), (1, 1), (2, 2)]  # engine version = updates trained
    assert all(gap < 1e-5 for _, _, gap in checker.checked)  # identical log-probs: the same weights
    ckpt = tmp_path / "after3.ckpt"
    trainer.save_checkpoint(ckpt)

    validated = EngineMatchesTrainer(prompt)
    module, data = parts(3)
    (results,) = _trainer(tmp_path, validated).validate(module, datamodule=data, ckpt_path=ckpt)
    assert results["eval/policy_version"] == 3.0  # the evaluation episodes were played by the restored weights
    resumed = EngineMatchesTrainer(prompt)
    module, data = parts(4)
    _trainer(tmp_path, resumed).fit(module, datamodule=data, ckpt_path=ckpt)
    for restored in (validated, resumed):
        # (the validation hook can run once more than there are batches: the dataloader_iter flavour)
        assert {(v, s) for v, s, _ in restored.checked} == {(3, 3)} and restored.checked[0][2] < 1e-5
    assert validated.replies[0] == resumed.replies[0]


def test_weights_streamed_in_small_buckets_reach_the_engine(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The weight sync with buckets far smaller than the model (many buckets per sync): after every update the
    engine's greedy reply and log-probs are the trainer's; the sync logs its buckets and bytes."""
    model = tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "#P_O#"}], tokenize=False, add_generation_prompt=True
    )
    checker = EngineMatchesTrainer(tokenizer.encode(text, add_special_tokens=False))
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))
    data = RolloutDataModule(
        str(model),
        rollout=RolloutConfig(env_id="frozenlake", group_size=2, batch_size=4, episode=episode),
        envs=EnvsConfig(endpoints="local"),
    )
    module = AgentRLModule(
        str(model), algorithm=AlgorithmConfig(), optim=OptimConfig(lr=3e-3), rollout_steps=3, sync_bucket_bytes=16_384
    )
    trainer = _trainer(tmp_path, checker)
    trainer.fit(module, datamodule=data)
    assert [(v, s) for v, s, _ in checker.checked] == [(0, 0), (1, 1), (2, 2)]
    assert all(gap < 1e-5 for _, _, gap in checker.checked)  # the engine has the updated weights
    metrics = trainer.callback_metrics
    weights = sum(p.numel() * p.element_size() for p in module.actor.state_dict().values())
    assert float(metrics["sync/bytes"]) == weights and float(metrics["sync/buckets"]) > 10
