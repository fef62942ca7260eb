"""LoRA (``model.lora``) on the tiny model: only the adapters train, checkpoints hold them alone and resume exactly,
an exported adapter loads with plain PEFT, and merged weights are the trainer's model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.trainers import checkpointing_trainer
from test_module import fit

from roll_lightning.checks.handmade import GOOD, FixedBatches, handmade_batch, reply_logprob
from roll_lightning.training.config import AlgorithmConfig, LoraConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.lora import base_name as lora_base_name
from roll_lightning.training.lora import export_adapter, merged_entries
from roll_lightning.training.module import AgentRLModule

LORA = LoraConfig(rank=4, alpha=8)


def lora_module(model_dir: Path, algorithm: AlgorithmConfig = AlgorithmConfig(), steps: int = 1) -> AgentRLModule:
    return AgentRLModule(
        str(model_dir), algorithm=algorithm, optim=OptimConfig(lr=1e-2), lora=LORA, rollout_steps=steps
    )


@pytest.mark.parametrize("algorithm", [AlgorithmConfig(), AlgorithmConfig(kl_coef=0.1)], ids=["grpo", "kl-to-the-base"])
def test_only_the_adapters_train(model_dir: Path, tokenizer: Any, tmp_path: Path, algorithm: AlgorithmConfig) -> None:
    """After an update the base weights are bit-identical, every adapter's B moved, the optimiser holds the
    adapters alone, and the update did what an update does (advantaged replies gain). With KL the reference is
    the base itself (adapters off): no second model is loaded."""
    batch = handmade_batch(model_dir, tokenizer)
    module = lora_module(model_dir, algorithm)
    module.configure_model()
    assert module.reference is None
    base = {k: v.clone() for k, v in module.actor.state_dict().items() if ".lora_" not in k}
    adapters = {k: v.clone() for k, v in module.actor.state_dict().items() if ".lora_B" in k}
    good = [i for i in range(len(batch)) if GOOD in tokenizer.decode(batch.input_ids[i])]
    before = [reply_logprob(module.actor, batch, i) for i in good]
    trainer = fit(module, batch, tmp_path, rollout_steps=2 if algorithm.kl_coef else 1)
    after = module.actor.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())
    assert all(not torch.equal(after[k], v) for k, v in adapters.items())
    optimised = [p for group in module.optimizers().param_groups for p in group["params"]]
    trainable = [p for p in module.actor.parameters() if p.requires_grad]
    assert {id(p) for p in optimised} == {id(p) for p in trainable} and len(trainable) == 2 * len(adapters)
    assert all(reply_logprob(module.actor, batch, i) > b for i, b in zip(good, before, strict=True))
    if algorithm.kl_coef:
        assert float(trainer.callback_metrics["train/kl"]) > 0  # step 2: the adapted policy vs the base it left


def test_two_fsdp2_ranks_match_one_process_and_resume_exactly(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """LoRA under FSDP2 (2 ranks, gloo, a subprocess; the same batch on both ranks): two steps give the adapters
    of one process, the base stays as loaded, and one step + a full-file checkpoint + one more step from it give
    the two straight steps exactly."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    single = AgentRLModule(str(model_dir), optim=OptimConfig(lr=1e-3), lora=LORA)
    fit(single, handmade_batch(model_dir, tokenizer), tmp_path / "single", rollout_steps=2)
    tests = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    lora = json.dumps(dataclasses.asdict(LORA))
    done = subprocess.run(
        [sys.executable, str(tests / "support" / "lora_fsdp.py"), str(model_dir), str(tmp_path), lora],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    straight, resumed = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "resumed.pt")
    expected = single.actor.state_dict()
    assert set(straight) == set(resumed) == set(expected)
    original = AgentRLModule._load(model_dir).state_dict()
    for name, tensor in expected.items():
        assert torch.equal(straight[name], resumed[name]), name
        if ".lora_" not in name:  # the base: untouched on both
            assert torch.equal(straight[name], tensor) and torch.equal(tensor, original[lora_base_name(name)]), name
        else:
            delta = (straight[name] - tensor).abs().max().item()
            assert delta <= 1e-5 + 1e-3 * tensor.abs().max().item(), f"{name}: differs by {delta:.2e}"
    assert all(not torch.equal(t, 0 * t) for k, t in expected.items() if ".lora_B" in k)  # the adapters moved
    checkpoint = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["state_dict"] and all(".lora_" in k for k in checkpoint["state_dict"])


def test_merged_weights_are_the_trained_model(model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """What the transformers engine loads: the base model with ``W + B A * scale`` under its own names gives the
    trainer's log-probs."""
    from transformers import AutoModelForCausalLM

    batch = handmade_batch(model_dir, tokenizer)
    module = lora_module(model_dir)
    fit(module, batch, tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    merged = dict(merged_entries(module.actor))
    assert set(merged) <= set(plain.state_dict()) and len(merged) == len(plain.state_dict())
    plain.load_state_dict(merged)
    for row in range(len(batch)):
        assert abs(reply_logprob(plain, batch, row) - reply_logprob(module.actor, batch, row)) < 1e-5


def test_checkpoints_hold_the_adapters_resume_exactly_and_export_to_peft(
    model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    """Two steps, a checkpoint, two more from it equal four uninterrupted steps bit for bit; the checkpoint holds
    no base weight (smaller than the adapters' own size x 4, with AdamW's two moments); its adapter, exported,
    loads with ``peft.PeftModel.from_pretrained`` on the base model and computes the trainer's log-probs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    batch = handmade_batch(model_dir, tokenizer)

    def run(root: Path, steps: int, ckpt_path: str | None = None) -> AgentRLModule:
        module = lora_module(model_dir, steps=steps)
        checkpointing_trainer(root, False).fit(module, datamodule=FixedBatches(batch), ckpt_path=ckpt_path)
        return module

    straight = run(tmp_path / "straight", 4)
    run(tmp_path / "stopped", 2)
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    resumed = run(tmp_path / "stopped", 4, ckpt_path=str(last))
    assert resumed.steps_done == 4
    for (name, a), (_, b) in zip(straight.actor.state_dict().items(), resumed.actor.state_dict().items(), strict=True):
        assert torch.equal(a, b), name

    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["state_dict"] and all(".lora_" in k for k in state["state_dict"])
    adapter_bytes = sum(p.numel() * p.element_size() for p in resumed.actor.parameters() if p.requires_grad)
    base_bytes = sum(p.numel() * p.element_size() for p in resumed.actor.parameters() if not p.requires_grad)
    assert last.stat().st_size < 4 * adapter_bytes + 200_000 < base_bytes

    other = AgentRLModule(str(model_dir), lora=LoraConfig(rank=4, target_modules=["q_proj"]), rollout_steps=3)
    with pytest.raises(RuntimeError, match=r"model\.lora"):  # other adapters: refused, not half-loaded
        checkpointing_trainer(tmp_path / "other", False).fit(other, datamodule=FixedBatches(batch), ckpt_path=last)

    out = export_adapter(tmp_path / "stopped" / "checkpoints" / "last.ckpt", tmp_path / "adapter")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), out)
    loaded.eval()
    resumed.actor.eval()
    for row in range(len(batch)):
        assert abs(reply_logprob(loaded, batch, row) - reply_logprob(resumed.actor, batch, row)) < 1e-6


def test_lora_settings_name_their_key() -> None:
    with pytest.raises(TrainingConfigError, match=r"model\.lora\.rank must be >= 0"):
        LoraConfig(rank=-1)
    with pytest.raises(TrainingConfigError, match=r"model\.lora\.dropout must be in \[0, 1\)"):
        LoraConfig(rank=4, dropout=1.0)
    with pytest.raises(TrainingConfigError, match=r"model\.lora\.target_modules must be"):
        LoraConfig(rank=4, target_modules=[])
    assert LoraConfig(rank=4, target_modules=["q_proj"]).target_modules == ("q_proj",)
    assert not LoraConfig().enabled


@pytest.mark.parametrize("kind", ["transformers", "vllm", "vllm-merged"])
def test_the_engine_generates_with_the_trained_adapters(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, kind: str
) -> None:
    """After every update the engine's greedy reply and log-probs are the trainer's (LoRA policy): vLLM applies
    the adapters it was sent (the sync moves the adapters alone), the transformers engine and vLLM without LoRA
    (``model.lora.sync: merged``) load merged weights; a restored checkpoint reaches the engine before validation
    plays."""
    from training.test_weight_sync import EngineMatchesTrainer, _trainer
    from transformers import AutoTokenizer

    from roll_lightning.models.tiny import tiny_model
    from roll_lightning.rollout import EpisodeSettings, RolloutConfig
    from roll_lightning.rollout.datamodule import EnvsConfig, EvalConfig, RolloutDataModule
    from roll_lightning.rollout.engines import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig

    model = tiny_model(tmp_path_factory.getbasetemp() / "models", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "#P_O#"}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    adapters = kind == "vllm"
    rank = LORA.rank if adapters else 0  # what the CLI links (model.lora.sync: adapters; merged: 0)
    engine = EngineConfig(kind=kind.removesuffix("-merged"), max_lora_rank=rank, max_model_len=1024, kv_cache_gib=0.25)
    episode = EpisodeSettings(max_turns=2, max_context_tokens=1024, sampling=SamplingParams(max_new_tokens=8))

    def parts(steps: int) -> tuple[AgentRLModule, RolloutDataModule]:
        data = RolloutDataModule(
            str(model),
            engine=engine,
            rollout=RolloutConfig(env_id="frozenlake", group_size=2, batch_size=4, episode=episode),
            envs=EnvsConfig(endpoints="local"),
            evaluation=EvalConfig(episodes=2),
        )
        # an entropy bonus: every step moves the adapters, whatever the (random) model's rewards were
        algorithm = AlgorithmConfig(entropy_coef=0.1)
        module = AgentRLModule(str(model), algorithm, optim=OptimConfig(lr=3e-2), lora=LORA, rollout_steps=steps)
        return module, data

    class AlsoFromTheBase(EngineMatchesTrainer):
        """Records too how far the reply's log-probs under the base model (adapters off) are from the trainer's,
        which the engine's equal: an engine that ignored the adapters would be this far off."""

        base_gaps: list[float] = []

        def check(self, trainer: Any, pl_module: Any) -> None:
            super().check(trainer, pl_module)
            ids = torch.tensor([self.prompt + self.replies[-1]])
            tokens = ids[0, len(self.prompt) :, None]

            def logprobs() -> torch.Tensor:
                logits = pl_module.actor(ids).logits[0, len(self.prompt) - 1 : -1]
                return logits.log_softmax(-1).gather(-1, tokens)

            with torch.no_grad():
                trained = logprobs()
                with pl_module.actor.disable_adapter():
                    base = logprobs()
            self.base_gaps.append(float((trained - base).abs().max()))

    checker = AlsoFromTheBase(prompt)
    trainer = _trainer(tmp_path, checker)
    module, data = parts(3)
    trainer.fit(module, datamodule=data)
    assert [(v, s) for v, s, _ in checker.checked] == [(0, 0), (1, 1), (2, 2)]
    assert all(gap < 1e-5 for _, _, gap in checker.checked), checker.checked
    assert checker.base_gaps[0] < 1e-5 < 1e-3 < checker.base_gaps[-1]  # the engine plays the adapters, not the base
    metrics = trainer.callback_metrics
    adapter_bytes = sum(p.numel() * p.element_size() for p in module.actor.parameters() if p.requires_grad)
    weights = sum(t.numel() * t.element_size() for t in AgentRLModule._load(model).state_dict().values())
    assert float(metrics["sync/bytes"]) == (adapter_bytes if adapters else weights)
    assert float(metrics["sync/adapter"]) == float(adapters)

    ckpt = tmp_path / "after3.ckpt"
    trainer.save_checkpoint(ckpt)
    validated = EngineMatchesTrainer(prompt)
    module, data = parts(3)
    (results,) = _trainer(tmp_path, validated).validate(module, datamodule=data, ckpt_path=ckpt)
    assert results["eval/policy_version"] == 3.0
    assert {v for v, _, _ in validated.checked} == {3} and all(gap < 1e-5 for _, _, gap in validated.checked)
    assert validated.replies[0] == checker.replies[-1] or len(checker.replies) == 3
