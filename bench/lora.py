"""LoRA vs full fine-tuning on a CPU (issue 19), side by side in one run: SmolLM2-135M-Instruct.

- Variants: ``full`` (every weight trains) and ``lora`` (`model.lora`: rank ``--rank``, alpha 2 x rank,
  all-linear; the base frozen). Each runs in its own worker process, alternating (full, lora, lora, full, ...;
  ``--repeats`` pairs), so both see the same machine load and each process's peak RSS is its variant's own.
- A worker fits `AgentRLModule` (Lightning, one CPU process, ``--threads`` torch threads) on one synthetic rollout
  batch (``--rows`` rows of a ``--prompt``-token prompt and a ``--reply``-token reply, random ids, half the rows
  rewarded: every step updates) for ``--steps`` rollout steps, the old log-probs recomputed as in a run. Step time
  = wall time of `AgentRLModule.update` (no-grad pass, forward, backward, optimiser step), the median of the steps
  after the first. Peak RSS = the process's ``ru_maxrss`` once training is done (model load included, no engine
  yet); optimiser state = the bytes of every tensor in AdamW's state.
- Then the worker builds each engine of ``--engines`` on the model folder and syncs the trained actor into it
  ``--syncs`` times as a publish does (`policy_update`, `load_update`: full weights streamed in buckets; LoRA:
  the merged weights into the transformers engine, the adapters alone into vLLM, built with ``max_lora_rank``);
  sync time = the median wall time of those calls; sync bytes = what crossed. After the last sync the engine
  answers one prompt greedily and its log-probs are compared with the trainer's (``gap``): the sync must have
  moved the policy.
- With vLLM, one more process measures generation: the same LoRA policy (B ~ N(0, 1e-3)) served by vLLM as
  adapters (applied per request) and as merged weights, 16 concurrent 32-token replies (temperature 1),
  ``--gen-rounds`` rounds after one warm-up; tokens/s, median.

Run:  .venv/bin/python bench/lora.py             (about 7 minutes on 2 cores)
      .venv/bin/python bench/lora.py --quick     (1 pair, 2 steps, transformers engine only)
Prints a markdown table and writes bench/results/lora-<utc time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402
from bench.weight_sync import Loop, RssPeak  # noqa: E402

VARIANTS = ("full", "lora")


def synthetic_batch(rows: int, prompt: int, reply: int, vocab: int, pad_id: int) -> Any:
    """``rows`` one-turn trajectory rows in groups of 4 (random ids; rewards 1, 0, 1, 0 so every group has signal)."""
    import random

    from roll_lightning.rollout.episodes.batch import collate
    from roll_lightning.rollout.episodes.episode import Episode, Turn

    rng = random.Random(0)
    episodes = []
    for row in range(rows):
        group, member = divmod(row, 4)
        ids = [rng.randrange(10, vocab) for _ in range(prompt + reply)]
        turn = Turn(ids[:prompt], ids[prompt:], [-5.0] * reply, "length", 0, observation="", reply="")
        turn.reward = float(member % 2 == 0)
        episodes.append(Episode(group_index=group, member=member, seed=group, env_id="synthetic", turns=[turn]))
    return collate(episodes, "trajectory", pad_id)


def worker(cfg: dict[str, Any], out: Path) -> None:
    import lightning as L
    import torch
    from transformers import AutoTokenizer

    from roll_lightning.checks.handmade import FixedBatches
    from roll_lightning.models.smollm import smollm2_path
    from roll_lightning.training import LoraConfig, OptimConfig
    from roll_lightning.training.module import AgentRLModule

    torch.set_num_threads(cfg["threads"])
    model = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    lora = LoraConfig(rank=cfg["rank"], alpha=2 * cfg["rank"]) if cfg["variant"] == "lora" else LoraConfig()
    module = AgentRLModule(str(model), optim=OptimConfig(lr=1e-4), lora=lora, rollout_steps=cfg["steps"])
    update_s: list[float] = []
    original = module.update

    def timed(batch: Any) -> dict[str, float]:
        t0 = time.perf_counter()
        metrics = original(batch)
        update_s.append(time.perf_counter() - t0)
        return metrics

    module.update = timed  # type: ignore[method-assign]
    batch = synthetic_batch(cfg["rows"], cfg["prompt"], cfg["reply"], len(tokenizer), tokenizer.pad_token_id)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, max_steps=-1, max_epochs=-1, default_root_dir=out.parent,
    )  # fmt: skip
    trainer.fit(module, datamodule=FixedBatches(batch))
    optimiser = module.optimizers().optimizer
    state = [t for s in optimiser.state.values() for t in s.values() if torch.is_tensor(t)]
    result: dict[str, Any] = {
        "variant": cfg["variant"],
        "update_s": update_s,
        "train_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "optimiser_state_mib": sum(t.numel() * t.element_size() for t in state) / 2**20,
        "trainable_params": sum(p.numel() for p in module.actor.parameters() if p.requires_grad),
        "syncs": {},
    }
    module.actor.eval()
    for kind in cfg["engines"]:
        result["syncs"][kind] = sync_engine(kind, model, module.actor, lora.rank, cfg["syncs"], tokenizer)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.write_text(json.dumps(result))


def sync_engine(kind: str, model: Path, actor: Any, rank: int, syncs: int, tokenizer: Any) -> dict[str, Any]:
    """``syncs`` weight syncs of ``actor`` into a fresh engine of ``kind``; their times, bytes and the final gap."""
    import torch

    from roll_lightning.rollout.engines import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig, build_engine
    from roll_lightning.rollout.handover import load_update, takes_adapters
    from roll_lightning.training.weights import policy_update

    config = EngineConfig(kind=kind, max_lora_rank=rank, max_model_len=1024, kv_cache_gib=0.5, device="cpu")
    engine = build_engine(config, model)
    loop = Loop()
    times, sizes, memory = [], [], []
    for version in range(1, syncs + 1):
        with RssPeak() as peak:
            t0 = time.perf_counter()
            update = policy_update(actor, adapters=takes_adapters(engine), bucket_bytes=256 * 2**20)
            stats = load_update(engine, update, version, loop.call)
            times.append(time.perf_counter() - t0)
        sizes.append(stats["bytes"])
        memory.append(peak.delta / 2**20)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Push the box."}], tokenize=False)
    prompt = tokenizer.encode(text + "<|im_start|>assistant\n", add_special_tokens=False)
    reply = loop.call(engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0)))
    with torch.no_grad():
        logits = actor(torch.tensor([prompt + reply.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
    gap = float((torch.tensor(reply.logprobs) - expected).abs().max())
    loop.call(engine.close())
    loop.close()
    return {"sync_s": times, "bytes": sizes, "rss_delta_mib": memory, "gap": gap, "adapter": stats.get("adapter", 0)}


def generation_worker(cfg: dict[str, Any], out: Path) -> None:
    """vLLM tokens/s with the policy's adapters applied per request vs the same policy merged into the weights."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll_lightning.models.smollm import smollm2_path
    from roll_lightning.rollout.engines import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig, build_engine
    from roll_lightning.training import LoraConfig
    from roll_lightning.training.lora import adapter_config, adapter_tensors, apply_lora, merged_entries

    torch.set_num_threads(cfg["threads"])
    model = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    actor = apply_lora(base, LoraConfig(rank=cfg["rank"], alpha=2 * cfg["rank"]))
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    prompts = [
        tokenizer.encode(f"Question {i}: which move pushes the box?", add_special_tokens=False) for i in range(16)
    ]
    sampling = SamplingParams(max_new_tokens=32, temperature=1.0)

    async def tokens_per_s(engine: Any) -> float:
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
        return sum(len(r.token_ids) for r in replies) / (time.perf_counter() - t0)

    async def measure() -> dict[str, list[float]]:
        rates: dict[str, list[float]] = {}
        for mode in ("adapters", "merged"):
            rank = cfg["rank"] if mode == "adapters" else 0
            config = EngineConfig(kind="vllm", max_lora_rank=rank, max_model_len=1024, kv_cache_gib=0.5, device="cpu")
            engine = build_engine(config, model)
            if mode == "adapters":
                await engine.load_adapter(adapter_tensors(actor), adapter_config(actor), 1)
            else:
                await engine.load_weights(dict(merged_entries(actor)), 1)
            await tokens_per_s(engine)  # warm-up
            rates[mode] = [await tokens_per_s(engine) for _ in range(cfg["gen_rounds"])]
            await engine.close()
        return rates

    out.write_text(json.dumps(asyncio.run(measure())))


def run_worker(cfg: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    tag = f"{cfg['variant']}-{time.monotonic_ns()}"
    cfg_path, out = workdir / f"{tag}.json", workdir / f"{tag}.out.json"
    cfg_path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": str(cfg["threads"]), "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    mode = "--generation" if cfg["variant"] == "generation" else "--worker"
    proc = subprocess.run(
        [sys.executable, __file__, mode, str(cfg_path), str(out)],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"worker {cfg['variant']} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result.update(process_s=time.perf_counter() - t0, loadavg_after=os.getloadavg())
    print(f"  {cfg['variant']}: {result['process_s']:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    return result


def summarize(runs: list[dict[str, Any]], engines: list[str]) -> dict[str, dict[str, float]]:
    """Per variant: medians over every process (step time over the steps after each process's first)."""
    out: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        row = {
            "step_s": statistics.median(s for r in mine for s in r["update_s"][1:]),
            "train_peak_rss_mib": statistics.median(r["train_peak_rss_mib"] for r in mine),
            "optimiser_state_mib": statistics.median(r["optimiser_state_mib"] for r in mine),
            "trainable_params": mine[0]["trainable_params"],
        }
        for kind in engines:
            row[f"{kind}_sync_s"] = statistics.median(s for r in mine for s in r["syncs"][kind]["sync_s"])
            row[f"{kind}_sync_mib"] = statistics.median(b for r in mine for b in r["syncs"][kind]["bytes"]) / 2**20
            row[f"{kind}_gap"] = max(r["syncs"][kind]["gap"] for r in mine)
        out[variant] = row
    return out


def print_table(summary: dict[str, dict[str, float]], engines: list[str]) -> None:
    keys = [
        ("step_s", "step time (s)", "{:.2f}"),
        ("train_peak_rss_mib", "peak RSS, training (MiB)", "{:.0f}"),
        ("optimiser_state_mib", "optimiser state (MiB)", "{:.1f}"),
        ("trainable_params", "trainable parameters", "{:,.0f}"),
    ]
    for kind in engines:
        keys += [
            (f"{kind}_sync_mib", f"sync bytes, {kind} engine (MiB)", "{:.1f}"),
            (f"{kind}_sync_s", f"sync time, {kind} engine (s)", "{:.3f}"),
            (f"{kind}_gap", f"engine vs trainer log-prob gap, {kind}", "{:.1e}"),
        ]
    print("| | full | LoRA | LoRA / full |\n|---|---:|---:|---:|")
    for key, label, fmt in keys:
        full, lora = summary["full"][key], summary["lora"][key]
        ratio = "" if "gap" in key else f"{lora / full:.3f}x"
        print(f"| {label} | {fmt.format(full)} | {fmt.format(lora)} | {ratio} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--generation", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--gen-rounds", type=int, default=3, help="vLLM generation rounds per mode (adapters, merged)")
    p.add_argument("--quick", action="store_true", help="1 pair, 2 steps, transformers engine only")
    p.add_argument("--repeats", type=int, default=3, help="pairs of processes (full, lora, lora, full, ...)")
    p.add_argument("--steps", type=int, default=5, help="rollout steps per process (the first is not timed)")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--reply", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--engines", default="transformers,vllm")
    p.add_argument("--syncs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--worker-timeout", type=float, default=1200.0)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(Path(args.worker[0]).read_text()), Path(args.worker[1]))
        return
    if args.generation:
        generation_worker(json.loads(Path(args.generation[0]).read_text()), Path(args.generation[1]))
        return
    if args.quick:
        args.repeats, args.steps, args.engines = 1, 2, "transformers"
    engines = [e for e in args.engines.split(",") if e]
    import torch
    import transformers

    bench_run = Run("lora", quick=args.quick)
    results: dict[str, Any] = {
        "args": vars(args),
        "machine": {"torch": torch.__version__, "transformers": transformers.__version__},
        "runs": [],
    }
    order = [v for i in range(args.repeats) for v in (VARIANTS if i % 2 == 0 else VARIANTS[::-1])]
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        for variant in order:
            cfg = {**vars(args), "variant": variant, "engines": engines}
            results["runs"].append(run_worker(cfg, Path(tmp), args.worker_timeout))
        if "vllm" in engines:
            cfg = {**vars(args), "variant": "generation", "engines": engines}
            results["generation"] = run_worker(cfg, Path(tmp), args.worker_timeout)
    results["summary"] = summarize(results["runs"], engines)
    path = bench_run.write(results)
    print_table(results["summary"], engines)
    if "generation" in results:
        rates = {m: statistics.median(results["generation"][m]) for m in ("adapters", "merged")}
        print(f"vLLM generation, tokens/s: adapters {rates['adapters']:.1f}, merged {rates['merged']:.1f}")
    print(bench_run.footer())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
