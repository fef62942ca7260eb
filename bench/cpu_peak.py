"""How close each recipe's step is to what this CPU can do (issue 52, "the machine's limit").

1. Peak: the sustained matmul rate of torch on this process's threads (``torch.get_num_threads()``), float32 and
   bfloat16, square matmuls of a few sizes; per size a warm-up, then timed batches of matmuls (~0.1 s each; at most
   ``--repeats``, and no more once a size has spent ``--budget`` seconds), the median; a dtype's "peak" is its
   best size's median.
2. Recipes: a short ``python -m roll_lightning fit`` of each recipe (the project's own trainer, evaluations off,
   ``--model.rollout_steps N``) with the `StepRecord` callback added on the command line: per rollout step it
   records the update's wall time (`AgentRLModule.update`, timed around the call), the batch's real tokens, reply
   tokens and row lengths, the rollout's wall time and ``rollout/gen_tokens_per_s``; the first ``--skip`` steps
   are warm-up. One step (the last, left out of the medians) runs under ``torch.profiler``: its top ops.
3. Shares (model FLOPs utilisation, useful FLOPs only, padding not counted):
   - training FLOPs per step = 6 x N x tokens + 6 x V x d x reply tokens + 12 x L x d x sum(row length^2),
     N = the weights outside the embeddings and the output head (what every token runs through), the head
     (V x d) counted only where the trainer runs it (reply positions, `policy_forward`), the attention term
     PaLM's 12 x layers x hidden x context per token with context = the token's row length; over the update's
     wall time, against the peak in the dtype the recipe trains in (``model.dtype``: bf16 autocast or float32);
   - generation: 2 x (N + V x d) per generated token x ``rollout/gen_tokens_per_s`` (generated tokens over the
     rollout's wall time, env steps included), and beside it the engine's work with the prompts it prefilled
     (2 x N per prompt token + the decode FLOPs, over the same wall time), against the peak in the engine's dtype.

Run:  .venv/bin/python bench/cpu_peak.py           (peaks up to 4096, three recipes; 5-7 minutes on 2 cores)
      .venv/bin/python bench/cpu_peak.py --quick   (sizes 256 and 512, the tiny-words recipe; ~15 s)
Prints markdown tables and writes bench/results/cpu_peak-<utc time>[-quick].json.
"""

from __future__ import annotations

import argparse
import json
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

import torch  # noqa: E402
from lightning.pytorch.callbacks import Callback  # noqa: E402

from bench.support.results import Run  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SIZES = (256, 512, 1024, 2048, 4096)
QUICK_SIZES = (256, 512)
RECIPES = {  # name -> (config, rollout steps, extra fit arguments)
    "sokoban (tiny-grid)": ("configs/sokoban.yaml", 24, []),
    "frozenlake_learn (tiny-words)": ("configs/frozenlake_learn.yaml", 24, []),
    "frozenlake_llm (SmolLM2-135M)": ("configs/frozenlake_llm.yaml", 5, []),
}
QUICK_RECIPE = "frozenlake_learn (tiny-words)"
QUICK_STEPS = 4
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


# -- 1. the peak -------------------------------------------------------------------------------------------------


def matmul_rate(n: int, dtype: torch.dtype, repeats: int, budget_s: float, batch_s: float = 0.1) -> dict[str, Any]:
    """FLOP/s of an n x n by n x n matmul: one warm-up, then up to ``repeats`` timed batches of ``k`` matmuls (k
    sized so a batch takes about ``batch_s``; fewer batches once ``budget_s`` is spent, at least one), the median."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    t0 = time.perf_counter()
    torch.matmul(a, b, out=out)
    torch.matmul(a, b, out=out)
    k = max(1, min(1000, round(batch_s / max((time.perf_counter() - t0) / 2, 1e-6))))
    times: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(k):
            torch.matmul(a, b, out=out)
        times.append((time.perf_counter() - t0) / k)
        spent += times[-1] * k
        if spent > budget_s:
            break
    median = statistics.median(times)
    return {"n": n, "per_batch": k, "seconds": times, "median_s": median, "flops": 2 * n**3 / median}


def measure_peaks(sizes: tuple[int, ...], repeats: int, budget_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, dtype in DTYPES.items():
        rates = [matmul_rate(n, dtype, repeats, budget_s) for n in sizes]
        best = max(rates, key=lambda r: r["flops"])
        out[name] = {"sizes": rates, "peak_flops": best["flops"], "peak_n": best["n"]}
        print(
            f"{name}: "
            + ", ".join(f"{r['n']}: {r['flops'] / 1e9:.1f}" for r in rates)
            + f" GFLOP/s; peak {best['flops'] / 1e9:.1f} at {best['n']}",
            flush=True,
        )
    return out


# -- 2. the recipes' steps ----------------------------------------------------------------------------------------


class StepRecord(Callback):
    """Added to a ``fit`` (``--trainer.callbacks+=bench.cpu_peak.StepRecord``): one JSON line per rollout step
    in ``path`` (the update's wall time, the batch's tokens, the rollout's time and generation rate), the model's
    shape first; the update of rollout step ``profile_step`` runs under ``torch.profiler`` (its top ops in the
    line)."""

    def __init__(self, path: str, profile_step: int = 0) -> None:
        self.path = Path(path)
        self.profile_step = profile_step
        self._update_s = 0.0
        self._profile: list[dict[str, Any]] | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        actor = pl_module.actor
        config = actor.config.get_text_config()
        embeddings = {id(p) for p in actor.get_input_embeddings().parameters()}
        head = actor.get_output_embeddings()
        head_ids = {id(p) for p in head.parameters()} if head is not None else set()
        positions = {
            id(p) for name, p in actor.named_parameters() if name.endswith(("wpe.weight", "position_embeddings.weight"))
        }
        total = sum(p.numel() for p in actor.parameters())
        body = sum(p.numel() for p in actor.parameters() if id(p) not in embeddings | head_ids | positions)
        shape = {
            "params_total": total,
            "params_body": body,
            "tied_head": bool(head_ids and head_ids <= embeddings),
            "vocab": int(config.vocab_size),
            "hidden": int(config.hidden_size),
            "layers": int(config.num_hidden_layers),
            "model_dtype": pl_module.compute_dtype,
            "threads": torch.get_num_threads(),
        }
        with self.path.open("w") as f:
            f.write(json.dumps({"shape": shape}) + "\n")
        update = pl_module.update

        def timed_update(batch: Any) -> dict[str, float]:
            t0 = time.perf_counter()
            if pl_module.steps_done + 1 != self.profile_step:
                out = update(batch)
            else:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    out = update(batch)
                self._profile = top_ops(prof)
            self._update_s = time.perf_counter() - t0
            return out

        pl_module.update = timed_update

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        rollout = pl_module.fit_record.last_batch
        lengths = rollout.attention_mask.sum(-1)
        metrics = trainer.callback_metrics
        record = {
            "step": pl_module.steps_done,
            "update_s": self._update_s,
            "skipped": float(metrics.get("train/update_skipped", 0.0)),
            "rows": int(lengths.numel()),
            "tokens": int(lengths.sum()),
            "reply_tokens": int(rollout.response_mask.sum()),
            "sum_len_sq": int((lengths.double() ** 2).sum()),
            "width": int(rollout.input_ids.shape[1]),
            "rollout_s": float(metrics.get("timing/rollout_s", 0.0)),
            "rollout_wait_s": float(metrics.get("timing/rollout_wait_s", 0.0)),
            "gen_tokens_per_s": float(metrics.get("rollout/gen_tokens_per_s", 0.0)),
            "profiled": self._profile is not None,
        }
        if self._profile is not None:
            record["top_ops"], self._profile = self._profile, None
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def top_ops(prof: Any, limit: int = 12) -> list[dict[str, Any]]:
    """The ops with the most self CPU time, with their share of the profiled update's total."""
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total, "calls": e.count}
        for e in events[:limit]
    ]


def run_recipe(config: str, steps: int, extra: list[str], workdir: Path, timeout_s: float) -> list[dict[str, Any]]:
    """A ``fit`` of ``config`` for ``steps`` rollout steps with `StepRecord` (the last step profiled); its lines."""
    record = workdir / "steps.jsonl"
    args = [
        sys.executable, "-m", "roll_lightning", "fit", "--config", config,
        "--model.rollout_steps", str(steps), "--trainer.max_time", "null",
        "--trainer.default_root_dir", str(workdir / "run"),
        "--data.evaluation.during_fit", "false", "--data.evaluation.at_fit_start", "false",
        "--trainer.callbacks+=bench.cpu_peak.StepRecord",
        "--trainer.callbacks.init_args.path", str(record),
        "--trainer.callbacks.init_args.profile_step", str(steps),
        *extra,
    ]  # fmt: skip
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"fit of {config} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in record.read_text().splitlines()]


def shares(lines: list[dict[str, Any]], skip: int, peaks: dict[str, Any], engine_dtype: str) -> dict[str, Any]:
    """Tokens/s and shares of the peak from a run's `StepRecord` lines (module docstring, 3)."""
    shape = lines[0]["shape"]
    steps = [s for s in lines[1:] if not s["profiled"]]
    timed = [s for s in steps[skip:] if not s["skipped"]] or [s for s in steps if not s["skipped"]] or steps
    n, head = shape["params_body"], shape["vocab"] * shape["hidden"]
    attention = 12 * shape["layers"] * shape["hidden"]

    def train_flops(s: dict[str, Any]) -> float:
        return 6 * n * s["tokens"] + 6 * head * s["reply_tokens"] + attention * s["sum_len_sq"]

    train_rate = statistics.median(s["tokens"] / s["update_s"] for s in timed)
    train_flops_rate = statistics.median(train_flops(s) / s["update_s"] for s in timed)
    per_token = statistics.median(train_flops(s) / s["tokens"] for s in timed)
    gen_rate = statistics.median(s["gen_tokens_per_s"] for s in timed)
    gen_flops_rate = 2 * (n + head) * gen_rate
    # the engine's work: every prompt token prefilled (2N), every generated token decoded (2(N + Vd)), per second
    engine_rate = statistics.median(
        (2 * n * (s["tokens"] - s["reply_tokens"]) + 2 * (n + head) * s["reply_tokens"]) / s["rollout_s"]
        for s in timed
        if s["rollout_s"] > 0
    )
    train_peak = peaks[shape["model_dtype"]]["peak_flops"]
    gen_peak = peaks[engine_dtype]["peak_flops"]
    profiled_step = next((s for s in lines[1:] if s["profiled"]), None)
    profiled = profiled_step["top_ops"] if profiled_step else []
    # how fast the matmuls ran while they ran: the profiled update's linear-layer FLOPs over its mm/addmm self time
    mm_s = sum(op["self_s"] for op in profiled if op["op"] in MATMULS)
    linear = 6 * n * profiled_step["tokens"] + 6 * head * profiled_step["reply_tokens"] if profiled_step else 0
    return {
        "shape": shape,
        "engine_dtype": engine_dtype,
        "steps_timed": len(timed),
        "rows_median": statistics.median(s["rows"] for s in timed),
        "tokens_per_step": statistics.median(s["tokens"] for s in timed),
        "reply_tokens_per_step": statistics.median(s["reply_tokens"] for s in timed),
        "update_s": statistics.median(s["update_s"] for s in timed),
        "rollout_s": statistics.median(s["rollout_s"] for s in timed),
        "train_flops_per_token": per_token,
        "train_tokens_per_s": train_rate,
        "train_flops": train_flops_rate,
        "train_share": train_flops_rate / train_peak,
        "gen_flops_per_token": 2 * (n + head),
        "gen_tokens_per_s": gen_rate,
        "gen_flops": gen_flops_rate,
        "gen_share": gen_flops_rate / gen_peak,
        "engine_flops_with_prefill": engine_rate,
        "engine_share_with_prefill": engine_rate / gen_peak,
        "top_ops": profiled,
        "matmul_share_of_update": sum(op["share"] for op in profiled if op["op"] in MATMULS) if mm_s else None,
        "matmul_flops_while_in_matmul": linear / mm_s if mm_s else None,
        "matmul_share_of_peak_while_in_matmul": linear / mm_s / train_peak if mm_s else None,
        "steps": lines[1:],
    }


def engine_dtype_of(config: str) -> str:
    import yaml

    data = yaml.safe_load((REPO / config).read_text())
    return (data.get("data", {}).get("engine") or {}).get("dtype") or "float32"


# -- report ---------------------------------------------------------------------------------------------------------


def report(peaks: dict[str, Any], recipes: dict[str, Any], threads: int) -> None:
    print(f"\n### Peak (torch {torch.__version__}, {threads} threads)\n")
    sizes = [r["n"] for r in peaks["float32"]["sizes"]]
    print("| dtype | " + " | ".join(str(n) for n in sizes) + " | peak GFLOP/s |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for name, p in peaks.items():
        cells = " | ".join(f"{r['flops'] / 1e9:.1f}" for r in p["sizes"])
        print(f"| {name} | {cells} | **{p['peak_flops'] / 1e9:.1f}** (n={p['peak_n']}) |")
    for name, r in recipes.items():
        s = r["shape"]
        print(
            f"\n### {name}: {s['params_total'] / 1e6:.3f}M weights ({s['params_body'] / 1e6:.3f}M outside the "
            f"embeddings and head), {s['layers']} layers, hidden {s['hidden']}, vocab {s['vocab']}; trains in "
            f"{s['model_dtype']}, generates in {r['engine_dtype']}; {r['steps_timed']} steps timed, "
            f"{r['rows_median']:.0f} rows / {r['tokens_per_step']:.0f} tokens / {r['reply_tokens_per_step']:.0f} "
            f"reply tokens a step (median)\n"
        )
        print("| part | FLOPs per token | tokens/s | GFLOP/s | share of peak |")
        print("|---|---|---|---|---|")
        print(
            f"| training (update {r['update_s']:.2f} s) | {r['train_flops_per_token'] / 1e6:.2f} M | "
            f"{r['train_tokens_per_s']:.0f} | {r['train_flops'] / 1e9:.2f} | {100 * r['train_share']:.2f}% |"
        )
        print(
            f"| generation (rollout {r['rollout_s']:.2f} s) | {r['gen_flops_per_token'] / 1e6:.2f} M | "
            f"{r['gen_tokens_per_s']:.0f} | {r['gen_flops'] / 1e9:.3f} | {100 * r['gen_share']:.3f}% |"
        )
        print(
            f"| engine incl. prompt prefill | | | {r['engine_flops_with_prefill'] / 1e9:.2f} | "
            f"{100 * r['engine_share_with_prefill']:.2f}% |"
        )
        if r["top_ops"]:
            if r["matmul_flops_while_in_matmul"]:
                print(
                    f"\nIn the profiled update the matmuls (mm, addmm, bmm) ran at "
                    f"{r['matmul_flops_while_in_matmul'] / 1e9:.1f} GFLOP/s "
                    f"({100 * r['matmul_share_of_peak_while_in_matmul']:.0f}% of the peak, profiler overhead "
                    f"included) and took {100 * r['matmul_share_of_update']:.0f}% of its CPU time."
                )
            print("\n| op (one profiled update) | self s | share | calls |\n|---|---|---|---|")
            for op in r["top_ops"]:
                print(f"| `{op['op']}` | {op['self_s']:.3f} | {100 * op['share']:.1f}% | {op['calls']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 256 and 512, the tiny-words recipe, 4 steps")
    ap.add_argument("--recipes", nargs="*", choices=list(RECIPES), help="default: all (quick: tiny-words)")
    ap.add_argument("--sizes", type=int, nargs="*", help="matmul sizes (default 256..4096; quick 256 512)")
    ap.add_argument("--repeats", type=int, default=7, help="timed batches per size at most")
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of timed matmuls per size at most")
    ap.add_argument("--steps", type=int, help="rollout steps per recipe (default: per recipe)")
    ap.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the medians")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a recipe's fit may take")
    ap.add_argument("--out", type=Path, help="the JSON file (default bench/results/cpu_peak-<time>.json)")
    args = ap.parse_args()

    run = Run("cpu_peak", quick=args.quick)
    threads = torch.get_num_threads()
    sizes = tuple(args.sizes or (QUICK_SIZES if args.quick else SIZES))
    print(f"torch {torch.__version__}, {threads} threads, sizes {sizes}", flush=True)
    peaks = measure_peaks(sizes, 3 if args.quick else args.repeats, args.budget)
    names = args.recipes or ([QUICK_RECIPE] if args.quick else list(RECIPES))
    recipes: dict[str, Any] = {}
    for name in names:
        config, steps, extra = RECIPES[name]
        steps = args.steps or (QUICK_STEPS if args.quick else steps)
        print(f"{name}: fit {config} for {steps} rollout steps ...", flush=True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="cpu_peak-") as tmp:
            lines = run_recipe(config, steps, extra, Path(tmp), args.timeout)
        recipes[name] = {"config": config, "fit_s": time.perf_counter() - t0}
        recipes[name].update(shares(lines, args.skip, peaks, engine_dtype_of(config)))
        r = recipes[name]
        print(
            f"  training {r['train_tokens_per_s']:.0f} tokens/s, {100 * r['train_share']:.2f}% of the "
            f"{r['shape']['model_dtype']} peak; generation {r['gen_tokens_per_s']:.0f} tokens/s, "
            f"{100 * r['gen_share']:.3f}% ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    report(peaks, recipes, threads)
    path = run.write(
        {
            "machine": {"torch": torch.__version__, "threads": threads},
            "formulas": {
                "train": "6*N*tokens + 6*V*d*reply_tokens + 12*L*d*sum(row_len^2), N = weights outside embeddings/head",
                "generation": "2*(N + V*d) per generated token",
                "engine_with_prefill": "2*N per prompt token + 2*(N + V*d) per generated token",
            },
            "peaks": peaks,
            "recipes": recipes,
        },
        args.out,
    )
    print(f"\nwrote {path}\n{run.footer()}")


if __name__ == "__main__":
    main()
