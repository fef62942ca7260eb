"""What only a GPU can show, in one command: ``python bench/gpu_check.py`` (the checks: docs/gpus.md).

Each check returns one `Outcome`; tests/checks/test_gpu_check.py runs the CPU-capable ones on a CPU.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float = 0.0


def check_cuda() -> Outcome:
    if not torch.cuda.is_available():
        return Outcome("cuda", "SKIP", "no CUDA device visible (torch.cuda.is_available() is False)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return Outcome("cuda", "PASS", f"{len(names)} GPU(s): {', '.join(names)}; CUDA {torch.version.cuda}; "
                   f"bf16 {'yes' if torch.cuda.is_bf16_supported() else 'NO'}")  # fmt: skip


def _greedy_logprobs(model: torch.nn.Module, prompt: list[int], reply: list[int], device: str) -> torch.Tensor:
    ids = torch.tensor([prompt + reply], device=device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply, device=device)[:, None]).squeeze(-1).cpu()


def check_vllm(model_dir: Path, device: str = "cuda") -> Outcome:
    """Generate, sleep (memory freed), wake (same reply), sync perturbed weights (engine == trainer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll_lightning.rollout.engines import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig
    from roll_lightning.rollout.engines.vllm_engine import VLLMEngine

    config = EngineConfig(kind="vllm", dtype="float32", gpu_memory_utilization=0.3, max_model_len=512)
    engine = VLLMEngine(model_dir, config=config, device=device, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = [{"role": "user", "content": "Push the box: #####\n#P_O#\n#####"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    greedy = SamplingParams(max_new_tokens=8, temperature=0)
    notes = []

    async def run() -> bool:
        first = await engine.generate(prompt, greedy)
        if device.startswith("cuda"):
            free_before = torch.cuda.mem_get_info()[0]
            await engine.sleep()
            freed = torch.cuda.mem_get_info()[0] - free_before
            await engine.wake()
            notes.append(f"sleep freed {freed / 2**30:.2f} GiB")
            if freed <= 0:
                notes.append("FAIL: sleep freed no memory")
                return False
        again = await engine.generate(prompt, greedy)
        if again.token_ids != first.token_ids:
            notes.append(f"FAIL: after wake the greedy reply changed ({first.token_ids} -> {again.token_ids})")
            return False
        torch.backends.cuda.matmul.allow_tf32 = False  # the trainer side in exact float32
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
        generator = torch.Generator(device="cpu").manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.02 * torch.randn(param.shape, generator=generator).to(device))
        started = time.perf_counter()
        await engine.load_weights(model.state_dict(), 1)
        notes.append(f"weight sync {time.perf_counter() - started:.2f}s")
        synced = await engine.generate(prompt, greedy)
        expected = _greedy_logprobs(model, prompt, synced.token_ids, device)
        gap = float((torch.tensor(synced.logprobs) - expected).abs().max())
        ids = torch.tensor([prompt + synced.token_ids], device=device)
        with torch.no_grad():
            argmax = model(ids).logits[0, len(prompt) - 1 : -1].argmax(-1).cpu().tolist()
        notes.append(f"log-prob gap {gap:.1e}")
        if argmax != synced.token_ids or gap > 1e-2 or synced.policy_version != 1:
            notes.append(f"FAIL: engine {synced.token_ids} vs trainer argmax {argmax}")
            return False
        return True

    try:
        ok = asyncio.run(run())
    finally:
        asyncio.run(engine.close())
    return Outcome("vllm", "PASS" if ok else "FAIL", "; ".join(notes))


def check_fsdp2(model_dir: Path, ranks: int | None = None, backend: str = "nccl", accelerator: str = "gpu") -> Outcome:
    """FSDP2 on ``ranks`` devices (rank r trains group r) vs one process on all groups."""
    from roll_lightning.checks.handmade import FixedBatches, handmade_batch
    from roll_lightning.training import OptimConfig
    from roll_lightning.training.module import AgentRLModule

    ranks = ranks or torch.cuda.device_count()
    if ranks < 2:
        return Outcome("fsdp2", "SKIP", f"{ranks} device(s): FSDP2 needs 2 or more to shard")
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fsdp.pt"
        command = [sys.executable, "-m", "roll_lightning.checks.fsdp_worker", str(model_dir), str(out), "{}",
                   "--ranks", str(ranks), "--backend", backend, "--accelerator", accelerator]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp)
        if done.returncode != 0:
            return Outcome("fsdp2", "FAIL", f"the {ranks}-rank run failed: {done.stderr.strip()[-500:]}")
        sharded = torch.load(out)
        batch = handmade_batch(model_dir, AutoTokenizer.from_pretrained(model_dir), groups=ranks)
        single = AgentRLModule(str(model_dir), optim=OptimConfig(lr=1e-3), rollout_steps=1)
        _trainer(Path(tmp) / "single", accelerator, devices=1).fit(single, datamodule=FixedBatches(batch))
    original = AgentRLModule._load(model_dir).state_dict()
    worst = 0.0
    for name, tensor in single.actor.state_dict().items():
        tensor = tensor.cpu()
        moved = (tensor - original[name]).abs().max().item()
        worst = max(worst, (sharded[name] - tensor).abs().max().item() / (1e-5 + 1e-3 * moved))
    status = "PASS" if worst <= 1.0 else "FAIL"
    return Outcome("fsdp2", status, f"{ranks} ranks over {backend} vs 1 process: worst difference {worst:.2f} of "
                   "the tolerance (1e-5 + 1e-3 x how far the update moved the tensor)")  # fmt: skip


def _trainer(root: Path, accelerator: str, devices: int) -> object:
    import lightning as L

    return L.Trainer(default_root_dir=root, accelerator=accelerator, devices=devices, max_steps=-1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip


def check_bf16(model_dir: Path, accelerator: str = "gpu", steps: int = 3) -> Outcome:
    """Three bf16 updates on the handmade batch: finite, and the advantaged reply gains probability."""
    from transformers import AutoTokenizer

    from roll_lightning.checks.handmade import GOOD, FixedBatches, handmade_batch, reply_logprob
    from roll_lightning.training import OptimConfig
    from roll_lightning.training.module import AgentRLModule

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = handmade_batch(model_dir, tokenizer)
    good = next(i for i in range(len(batch)) if GOOD in tokenizer.decode(batch.input_ids[i]))
    module = AgentRLModule(str(model_dir), dtype="bfloat16", optim=OptimConfig(lr=1e-3), rollout_steps=steps)
    module.configure_model()
    before = reply_logprob(module.actor.float(), batch, good)
    with tempfile.TemporaryDirectory() as tmp:
        _trainer(Path(tmp), accelerator, devices=1).fit(module, datamodule=FixedBatches(batch))
    after = reply_logprob(module.actor.float().cpu(), batch, good)
    finite = all(torch.isfinite(p).all() for p in module.actor.parameters())
    detail = f"{steps} bf16 updates: log p(good reply) {before:.3f} -> {after:.3f}; weights finite: {finite}"
    return Outcome("bf16", "PASS" if finite and after > before else "FAIL", detail)


def check_fit(steps: int = 3) -> Outcome:
    """The main command with the GPU overlay and the tiny model, ``steps`` rollout steps."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "roll_lightning", "fit", "--config", "configs/sokoban.yaml", "--config",
            "configs/gpu.yaml", "--model.rollout_steps", str(steps), "--trainer.default_root_dir", tmp,
            "--data.evaluation.during_fit", "false", "--data.evaluation.at_fit_start", "false",
            "--data.rollout.batch_size", "16", "--data.rollout.concurrent_episodes", "16",
        ]  # fmt: skip
        env = {**os.environ, "ROLL_MODEL": "tiny", "NUM_GPUS": os.environ.get("NUM_GPUS", "1")}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        metrics = list(Path(tmp).rglob("metrics.csv"))
    if done.returncode != 0:
        return Outcome("fit", "FAIL", f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
    return Outcome("fit", "PASS", f"{steps} rollout steps with configs/gpu.yaml (metrics: {len(metrics)} file(s))")


def check_vision(device: str = "cuda", steps: int = 2) -> Outcome:
    """vLLM's multimodal input against the trainer's forward, then the VL fit (2 steps)."""
    if importlib.util.find_spec("torchvision") is None:  # vLLM's Qwen2-VL processor imports it
        return Outcome("vision", "SKIP", "torchvision is not installed (vLLM's Qwen2-VL needs it)")
    from roll_lightning.models.resolve import resolve_model

    model_dir = resolve_model("tiny-vl")
    gap, sampled = asyncio.run(_vision_gap(model_dir, device))
    notes = [f"vLLM vs trainer log-prob gap with a picture {gap:.1e}"]
    if gap > 1e-2 or sampled:
        return Outcome("vision", "FAIL", "; ".join([*notes, f"placeholders sampled: {sampled}"]))
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "roll_lightning", "fit", "--config", "configs/sokoban_vl.yaml", "--config",
            "configs/gpu.yaml", "--model.rollout_steps", str(steps), "--trainer.default_root_dir", tmp,
        ]  # fmt: skip
        env = {**os.environ, "ROLL_MODEL": "tiny-vl", "NUM_GPUS": os.environ.get("NUM_GPUS", "1")}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        return Outcome(
            "vision", "FAIL", "; ".join([*notes, f"fit exit {done.returncode}: {done.stderr.strip()[-500:]}"])
        )
    return Outcome("vision", "PASS", "; ".join([*notes, f"sokoban_vl.yaml + gpu.yaml: {steps} rollout steps"]))


async def _vision_gap(model_dir: Path, device: str) -> tuple[float, list[int]]:
    """Greedy reply to a board picture: max |engine - trainer| log-prob, placeholders sampled."""
    import io

    from PIL import Image
    from transformers import AutoTokenizer

    from roll_lightning.env_client.session import ObservationImage
    from roll_lightning.models.resolve import load_policy
    from roll_lightning.rollout.engines import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig
    from roll_lightning.rollout.engines.vllm_engine import VLLMEngine
    from roll_lightning.rollout.prompts.vision import ImageEncoder, Prompt, model_inputs, vision_token_ids

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoder = ImageEncoder.load(model_dir, tokenizer)
    assert encoder is not None
    png = io.BytesIO()
    Image.new("RGB", (168, 112), (40, 90, 220)).save(png, format="PNG")
    picture = encoder.encode(ObservationImage(png.getvalue(), "image/png"))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Push the box: <image>"}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    before, after = text.split("<image>")
    ids = tokenizer.encode(before, add_special_tokens=False) + encoder.placeholder(picture)
    prompt = Prompt(ids + tokenizer.encode(after, add_special_tokens=False), [picture])
    config = EngineConfig(kind="vllm", dtype="float32", gpu_memory_utilization=0.3, max_model_len=512)
    engine = VLLMEngine(model_dir, config=config, device=device, seed=0)
    try:
        reply = await engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0))
    finally:
        await engine.close()
    model = load_policy(model_dir).to(device).eval()
    full = torch.tensor([[*prompt, *reply.token_ids]], device=device)
    with torch.no_grad():
        logits = model(input_ids=full, **model_inputs(full, [[picture]], model.config.image_token_id)).logits
    suppressed = list(vision_token_ids(model.config))
    logits = logits[0, len(prompt) - 1 : -1].float().index_fill(-1, torch.tensor(suppressed, device=device), -1e30)
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply.token_ids, device=device)[:, None])
    gap = float((torch.tensor(reply.logprobs) - expected.squeeze(-1).cpu()).abs().max())
    return gap, [t for t in reply.token_ids if t in suppressed]


PARTIAL_DEVICES = '[train, "cuda:{local_rank + local_world_size}"]'


def check_partial(steps: int = 3) -> Outcome:
    """Partial overlap with a second generating GPU: the fit runs and every shrink frees training-GPU memory."""
    if torch.cuda.device_count() < 2:
        return Outcome("partial", "SKIP", f"needs 2 GPUs, {torch.cuda.device_count()} visible")
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "roll_lightning", *partial_args(tmp, steps)]
        env = {**os.environ, "ROLL_MODEL": "tiny", "NUM_GPUS": "1"}
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        released = column(Path(tmp), "rollout/shrink_released_gib")
    if done.returncode != 0:
        return Outcome("partial", "FAIL", f"exit {done.returncode}: {done.stderr.strip()[-600:]}")
    ok = len(released) == steps and all(gib > 0 for gib in released)
    return Outcome("partial", "PASS" if ok else "FAIL", f"freed per shrink on the training GPU: {released} GiB")


def partial_args(root: str, steps: int) -> list[str]:
    return [
        "fit", "--config", "configs/sokoban.yaml", "--config", "configs/gpu.yaml", "--model.rollout_steps", str(steps),
        "--trainer.default_root_dir", root, "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", root,
        "--data.evaluation.during_fit", "false", "--data.evaluation.at_fit_start", "false",
        "--data.rollout.batch_size", "16", "--data.rollout.concurrent_episodes", "16",
        "--data.colocate", "partial", "--data.engine.devices", PARTIAL_DEVICES,
        "--data.rollout.max_staleness", "1", "--data.engine.gpu_memory_utilization", "0.3",
    ]  # fmt: skip


def column(root: Path, name: str) -> list[float]:
    import csv

    values: list[float] = []
    for path in root.rglob("metrics.csv"):
        values += [float(row[name]) for row in csv.DictReader(path.open()) if row.get(name)]
    return values


def run_all(model_dir: Path, report: Callable[[Outcome], None]) -> list[Outcome]:
    outcomes = [check_cuda()]
    report(outcomes[0])
    if outcomes[0].status != "PASS":
        return outcomes
    checks: list[tuple[str, Callable[[], Outcome]]] = [
        ("vllm", lambda: check_vllm(model_dir)),
        ("fsdp2", lambda: check_fsdp2(model_dir)),
        ("bf16", lambda: check_bf16(model_dir)),
        ("fit", check_fit),
        ("vision", check_vision),
        ("partial", check_partial),
    ]
    for name, check in checks:
        started = time.perf_counter()
        try:
            outcome = check()
        except Exception as err:  # one broken check is a FAIL row, not the end of the table
            outcome = Outcome(name, "FAIL", f"{type(err).__name__}: {err}"[:600])
        outcome = Outcome(outcome.name, outcome.status, outcome.detail, time.perf_counter() - started)
        outcomes.append(outcome)
        report(outcome)
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    rows = [f"| {o.name} | {o.status} | {o.seconds:.0f} s | {o.detail} |" for o in outcomes]
    return "\n".join(["| check | result | time | detail |", "|---|---|---|---|", *rows])


def summary_json(outcomes: list[Outcome]) -> str:
    return json.dumps([o.__dict__ for o in outcomes], indent=2)
