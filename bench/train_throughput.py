"""Training benchmark (issue 5): tokens/s of `AgentRLModule` updates, padded vs packed micro-batches, 1 vs 2 ranks.

- Models: the tiny random Qwen2 (`roll_lightning.models.tiny` defaults: width 64, 2 layers) and a ~31M-parameter
  one built by the same recipe (width 512, 8 layers, 8 heads, 2 KV heads, vocab 512).
- Batch: synthetic trajectory rows with a multi-turn length distribution (bench/support/train_worker.py:
  a shared 150-300 token first prompt per group, 2-10 turns of a 10-60 token reply and a 60-150 token
  observation, short episodes more common, capped at 2048 tokens), GRPO groups of 8, random rewards, built
  with `collate` from hand-made `Episode`s; fixed seed.
- Variants: ``padded`` = ``micro_batching="fixed", micro_batch_size=k`` (rows in order, every micro-batch padded
  to the batch's longest row); ``packed`` = ``micro_batching="token_budget", max_tokens_per_micro=T`` (rows
  sorted by length, grouped under T tokens, each micro-batch padded to its own longest row). T = k x the batch
  width, so a packed forward is never larger than a padded one (same peak activation memory). This is padding
  removal, not varlen packing: concatenating rows into one sequence needs flash-attention's varlen kernels
  (no CPU build), so a packed micro-batch still pads to its longest row.
- One training step = `AgentRLModule.update` on the whole batch: ``ppo_epochs=1, mini_batches=1``, GRPO + PPO
  loss; ``recompute_old_logprobs=False`` unless ``--recompute`` (the recompute pass ignores ``micro_batching``: it
  is always token-budget packed, so it would add the same cost to both variants).
- Ranks: 1 rank with 2 torch threads vs 2 ranks (FSDP2 via `ModelParallelStrategy`, gloo, CPU) with 1 thread
  each (OMP_NUM_THREADS), the same 2 cores either way. Rank r trains on groups r, r+2, ... (whole groups, each
  rank collates and pads its own rows, as the rollout does); tokens/s is the total over ranks divided by the
  step's wall time (both ranks time the same barrier-to-barrier interval; the slower one counts).
- Timing: each worker process runs 2 warm-up steps (one per variant, on a few short rows) and then alternates the
  variants on the full batch (padded, packed, packed, padded, ...), so both see the same load; 1-rank and
  2-rank processes alternate too. Tokens/s = real (non-pad) tokens / step wall time. Pad fraction = pad tokens /
  computed tokens (rows x width summed over the forwards of the gradient pass).

Run:  .venv/bin/python bench/train_throughput.py          (full: tiny + 30M, about 10 minutes; 612 s at load 3-6)
      .venv/bin/python bench/train_throughput.py --quick  (smoke: tiny model only, about 1 minute)
Prints tables and writes bench/results/train_throughput-<utc time>.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
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

import lightning  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from bench.support.models import bench_tiny_model  # noqa: E402
from bench.support.results import Run  # noqa: E402
from bench.support.train_worker import plan_stats, rank_batch, synthetic_episodes, variant_config  # noqa: E402
from roll_lightning.training import AlgorithmConfig  # noqa: E402

WORKER = REPO / "bench" / "support" / "train_worker.py"
MODELS: dict[str, dict[str, int]] = {
    "tiny": {},  # build_tiny_model's defaults: width 64, 2 layers, 2 heads, 1 KV head
    "30m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2},
}
VARIANTS = ("padded", "packed")
TARGET = 1.5


def param_count(model_dir: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += math.prod(st.get_slice(key).get_shape())
    return total


def run_worker(cfg: dict[str, Any], threads: int, workdir: Path, timeout_s: float) -> list[dict[str, Any]]:
    """One worker process (Lightning starts its other ranks); returns every rank's output."""
    tag = f"{cfg['model']}-r{cfg['devices']}-{time.monotonic_ns()}"
    cfg_path = workdir / f"{tag}.json"
    cfg_path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(cfg_path), str(workdir / tag)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    outs = [json.loads((workdir / f"{tag}.rank{r}.json").read_text()) for r in range(cfg["devices"])]
    outs[0]["process_wall_s"] = time.perf_counter() - started
    return outs


def merge_steps(outs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step over all ranks: wall = the slowest rank's, tokens summed."""
    steps = []
    for per_rank in zip(*(o["steps"] for o in outs), strict=True):
        assert len({s["variant"] for s in per_rank}) == 1
        real = sum(s["real_tokens"] for s in per_rank)
        computed = sum(s["computed_tokens"] for s in per_rank)
        wall = max(s["wall_s"] for s in per_rank)
        steps.append(
            {
                "step": per_rank[0]["step"],
                "variant": per_rank[0]["variant"],
                "warmup": per_rank[0]["warmup"],
                "wall_s": wall,
                "rank_wall_s": [s["wall_s"] for s in per_rank],
                "no_grad_s": max(s["no_grad_s"] for s in per_rank),
                "real_tokens": real,
                "computed_tokens": computed,
                "pad_fraction": 1 - real / computed,
                "largest_forward_tokens": max(s["largest_forward_tokens"] for s in per_rank),
                "tokens_per_s": real / wall,
            }
        )
    return steps


def schedule(pairs: int) -> list[str]:
    """Warm-up padded, packed; then ABBA: padded, packed, packed, padded, ..."""
    out = ["padded", "packed"]
    for i in range(pairs):
        out += ["padded", "packed"] if i % 2 == 0 else ["packed", "padded"]
    return out


def bench_model(args: argparse.Namespace, name: str, workdir: Path) -> dict[str, Any]:
    kwargs = MODELS[name]
    model_dir = bench_tiny_model(**kwargs)
    config = json.loads((model_dir / "config.json").read_text())
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(model_dir).pad_token_id
    rows = args.rows_tiny if name == "tiny" else args.rows_30m
    groups = rows // args.group_size
    pairs = args.pairs_tiny if name == "tiny" else args.pairs_30m
    episodes = synthetic_episodes(groups, args.group_size, args.seed, config["vocab_size"])
    full = rank_batch(episodes, 0, 1, pad_id)
    lengths = sorted(full.attention_mask.sum(-1).tolist())
    budget = args.budget or args.k * full.input_ids.shape[1]
    variants = {v: variant_config(v, k=args.k, budget=budget, recompute=args.recompute) for v in VARIANTS}
    plans = {
        ranks: {
            v: [
                plan_stats(rank_batch(episodes, r, ranks, pad_id), AlgorithmConfig(**variants[v])) for r in range(ranks)
            ]
            for v in VARIANTS
        }
        for ranks in args.ranks
    }
    res: dict[str, Any] = {
        "model_dir": str(model_dir),
        "model_kwargs": kwargs,
        "params": param_count(model_dir),
        "config": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")},
        "rows": rows,
        "groups": groups,
        "row_lengths": {
            "min": lengths[0],
            "p25": lengths[len(lengths) // 4],
            "median": statistics.median(lengths),
            "mean": statistics.fmean(lengths),
            "p75": lengths[3 * len(lengths) // 4],
            "max": lengths[-1],
            "all": lengths,
        },
        "k": args.k,
        "budget": budget,
        "variants": variants,
        "plans": plans,
        "runs": {str(r): [] for r in args.ranks},
    }
    print(
        f"\n== {name}: {res['params'] / 1e6:.2f}M params, {rows} rows ({groups} groups of {args.group_size}), "
        f"lengths {lengths[0]}..{lengths[-1]} (median {statistics.median(lengths):.0f}), k={args.k}, T={budget}",
        flush=True,
    )
    for repeat in range(args.repeats):
        order = list(args.ranks) if repeat % 2 == 0 else list(reversed(args.ranks))
        for ranks in order:
            cfg = {
                "model": name,
                "devices": ranks,
                "model_dir": str(model_dir),
                "groups": groups,
                "group_size": args.group_size,
                "seed": args.seed,
                "vocab": config["vocab_size"],
                "pad_id": pad_id,
                "variants": variants,
                "schedule": schedule(pairs),
                "warmup": 2,
                "warmup_rows": args.group_size if name == "tiny" else 2,
                "root_dir": str(workdir),
            }
            threads = args.threads if ranks == 1 else 1
            outs = run_worker(cfg, threads, workdir, args.worker_timeout)
            steps = merge_steps(outs)
            run = {
                "repeat": repeat,
                "threads_per_rank": threads,
                "process_wall_s": outs[0]["process_wall_s"],
                "max_rss_mb": [o["max_rss_mb"] for o in outs],
                "loadavg_after": os.getloadavg(),
                "steps": steps,
            }
            res["runs"][str(ranks)].append(run)
            timed = [s for s in steps if not s["warmup"]]
            print(
                f"  {ranks} rank(s) x {threads} thread(s), repeat {repeat}: "
                + ", ".join(f"{s['variant']} {s['wall_s']:.2f}s ({s['tokens_per_s']:.0f} tok/s)" for s in timed)
                + f"  [process {run['process_wall_s']:.0f}s, load {os.getloadavg()[0]:.1f}]",
                flush=True,
            )
    res["summary"] = summarize(res)
    return res


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ranks, runs in res["runs"].items():
        timed = [s for run in runs for s in run["steps"] if not s["warmup"]]
        per: dict[str, Any] = {}
        for v in VARIANTS:
            steps = [s for s in timed if s["variant"] == v]
            per[v] = {
                "steps": len(steps),
                "tokens_per_s_median": statistics.median(s["tokens_per_s"] for s in steps),
                "tokens_per_s_all": [s["tokens_per_s"] for s in steps],
                "step_s_median": statistics.median(s["wall_s"] for s in steps),
                "real_tokens": steps[0]["real_tokens"],
                "computed_tokens": steps[0]["computed_tokens"],
                "pad_fraction": steps[0]["pad_fraction"],
                "largest_forward_tokens": steps[0]["largest_forward_tokens"],
                "forwards": sum(p["forwards"] for p in res["plans"][int(ranks)][v]),
            }
        # adjacent steps of a pair ran back to back: their ratio is the least noisy one
        pair_ratios = []
        for run in runs:
            t = [s for s in run["steps"] if not s["warmup"]]
            for a, b in zip(t[::2], t[1::2], strict=True):
                by = {a["variant"]: a, b["variant"]: b}
                pair_ratios.append(by["packed"]["tokens_per_s"] / by["padded"]["tokens_per_s"])
        per["packed_over_padded"] = per["packed"]["tokens_per_s_median"] / per["padded"]["tokens_per_s_median"]
        per["packed_over_padded_pairs"] = pair_ratios
        out[ranks] = per
    if "1" in out and "2" in out:
        for v in VARIANTS:
            out[f"2_over_1_{v}"] = out["2"][v]["tokens_per_s_median"] / out["1"][v]["tokens_per_s_median"]
    return out


def print_tables(results: dict[str, Any]) -> None:
    print(
        "\n| model | ranks x threads | variant | tokens/s (median) | per step | step s | pad fraction | "
        "largest forward (tokens) | packed / padded |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, res in results["models"].items():
        for ranks, per in res["summary"].items():
            if not ranks.isdigit():
                continue
            threads = results["threads"] if ranks == "1" else 1
            for v in VARIANTS:
                s = per[v]
                ratio = ""
                if v == "packed":
                    pairs = ", ".join(f"{r:.2f}" for r in per["packed_over_padded_pairs"])
                    ratio = f"**{per['packed_over_padded']:.2f}x** (pairs {pairs})"
                print(
                    f"| {name} | {ranks} x {threads} | {v} | {s['tokens_per_s_median']:,.0f} | "
                    f"{', '.join(f'{x:,.0f}' for x in s['tokens_per_s_all'])} | {s['step_s_median']:.2f} | "
                    f"{s['pad_fraction']:.1%} | {s['largest_forward_tokens']:,} | {ratio} |"
                )
        for v in VARIANTS:
            key = f"2_over_1_{v}"
            if key in res["summary"]:
                print(f"{name}: 2 ranks / 1 rank, {v}: {res['summary'][key]:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny model only, 16 rows, 1 pair (about 1 min)")
    p.add_argument("--models", default="tiny,30m", help="comma-separated: tiny, 30m")
    p.add_argument("--ranks", default="1,2", help="comma-separated rank counts to run (1, 2)")
    p.add_argument("--rows-tiny", type=int, default=32, help="rows per rollout batch, tiny model (whole groups)")
    p.add_argument("--rows-30m", type=int, default=16, help="rows per rollout batch, 30M model (whole groups)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--pairs-tiny", type=int, default=2, help="timed steps per variant per process, tiny model")
    p.add_argument("--pairs-30m", type=int, default=1, help="timed steps per variant per process, 30M model")
    p.add_argument("--repeats", type=int, default=1, help="worker processes per rank count (alternating 1/2 ranks)")
    p.add_argument("--k", type=int, default=4, help="padded: micro_batch_size")
    p.add_argument("--budget", type=int, default=0, help="packed: max_tokens_per_micro (0 = k x batch width)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of the 1-rank run (2-rank runs use 1 each)")
    p.add_argument("--recompute", action="store_true", help="recompute_old_logprobs=True (a no-grad pass per step)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker-timeout", type=float, default=1200.0)
    args = p.parse_args()
    if args.quick:
        args.models, args.rows_tiny, args.pairs_tiny = "tiny", 16, 1
    args.ranks = [int(r) for r in args.ranks.split(",")]
    names = [m for m in args.models.split(",") if m]
    bench_run = Run("train_throughput", quick=args.quick)
    results: dict[str, Any] = {
        "args": vars(args),
        "threads": args.threads,
        "machine": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "lightning": lightning.__version__,
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="train_throughput-") as tmp:
        for name in names:
            t0 = time.perf_counter()
            results["models"][name] = bench_model(args, name, Path(tmp))
            results["models"][name]["section_s"] = time.perf_counter() - t0
    path = bench_run.write(results)
    print_tables(results)
    for name, res in results["models"].items():
        for ranks in args.ranks:
            ratio = res["summary"][str(ranks)]["packed_over_padded"]
            verdict = "met" if ratio >= TARGET else "missed"
            print(f"target packed >= {TARGET}x padded, {name}, {ranks} rank(s): {ratio:.2f}x: {verdict}")
    print(bench_run.footer())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
