"""Partial GPU overlap (issue 19): colocated vs disaggregated vs partial overlap at equal total devices, side by side.

A model-free training loop over ``--devices`` simulated devices (4 by default). Each device serves at most
``--slots`` replies at once, each taking ``--reply-s`` seconds (`DeviceEngine`: `SimulatedEngine`, a scheduling
stand-in, behind a per-device semaphore); the update is ``--train-work`` device-seconds of work, so it takes
``train_work / n`` seconds on n devices. Putting a replica to sleep or waking it costs ``--swap-s``. The three
ways to use the devices, each doing what the callbacks do (pause and publish, `rollout/handover.py`):

- ``colocated``: every device generates; when a batch is in, generation is suspended and every replica sleeps,
  the update runs on all devices, then the replicas wake and load the new weights.
- ``disaggregated``: half the devices generate, half train; generation goes on during the update
  (``max_staleness``), and pauses only for the weight load.
- ``partial``: every device generates; when a batch is in, the replicas on the training half are shrunk
  (`RolloutScheduler.shrink_sampler`: their replies in flight are asked again of the other half, which keeps
  generating), the update runs on the training half, then they are expanded and every replica loads.

The three run at the same time in one event loop on the same in-process env server (Sokoban 6x6), so the
machine's load falls on all alike. Two reply profiles: ``uniform`` (every reply ``--reply-s``) and ``long-tail``
(5% of the replies take 10x longer). Reported per variant, over the steps after ``--warmup``: episodes/s, step
time (median), the generation busy fraction (the share of generating-device time with at least one reply in
flight) and the device utilisation (generation busy time + update time, over every device's wall time), the
replies a shrink aborted per step, staleness, and the ratios to colocated.

Run:  .venv/bin/python bench/partial_overlap.py             (2 updates x 2 profiles, 12 steps each, ~2 min)
Writes bench/results/partial-overlap-<utc time>.json and a markdown section (printed, and written to --markdown).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.models import bench_tiny_model  # noqa: E402
from bench.support.results import Run, footer  # noqa: E402
from env_servers.server import EnvServer, ServerConfig  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.rollout.config.rollout import RolloutConfig  # noqa: E402
from roll_lightning.rollout.engines import EngineRouter, SamplingParams, SimulatedEngine  # noqa: E402
from roll_lightning.rollout.episodes.episode import EpisodeSettings  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

REPLIES = ("<answer>Left</answer>", "<answer>Up</answer>", "<answer>Down</answer>", "<answer>Right</answer>")
MODES = ("colocated", "disaggregated", "partial")
TAIL_SHARE, TAIL_FACTOR = 0.05, 10.0


class DeviceEngine(SimulatedEngine):
    """`SimulatedEngine` on one simulated device: at most ``slots`` replies at once (the rest queue), each taking
    ``reply_s`` (or, with ``tail``, 10x that for 5% of them); sleeping or waking takes ``swap_s``."""

    def __init__(self, tokenizer: Any, args: argparse.Namespace, seed: int, tail: bool) -> None:
        reply_s = args.reply_s

        rng = random.Random(seed)  # the reply times' own draws (the reply texts keep the engine's)

        def draw() -> float:
            return reply_s * TAIL_FACTOR if tail and rng.random() < TAIL_SHARE else reply_s

        super().__init__(tokenizer, REPLIES, latency_s=draw, seed=seed)
        self._swap_s = args.swap_s
        self._slots = asyncio.Semaphore(args.slots)
        self.asleep = False

    async def generate(self, prompt_ids: Any, params: SamplingParams, *, key: str = "") -> Any:
        async with self._slots:
            return await super().generate(prompt_ids, params, key=key)

    async def sleep(self) -> None:
        if not self.asleep:
            await asyncio.sleep(self._swap_s)
            self.asleep = True

    async def wake(self) -> None:
        if self.asleep:
            await asyncio.sleep(self._swap_s)
            self.asleep = False


def layout(mode: str, devices: int) -> tuple[list[str], int]:
    """The replicas' device labels and the number of devices that train."""
    half = devices // 2
    if mode == "colocated":
        return [f"gpu{i}" for i in range(devices)], devices
    if mode == "disaggregated":
        return [f"gpu{i}" for i in range(half, devices)], half
    return ["train"] * half + [f"gpu{i}" for i in range(half, devices)], half


async def train_loop(pool: EnvPool, tokenizer: Any, args: argparse.Namespace, mode: str, tail: bool) -> dict[str, Any]:
    labels, n_train = layout(mode, args.devices)
    engines = [DeviceEngine(tokenizer, args, seed=args.seed + i, tail=tail) for i in range(len(labels))]
    router = EngineRouter(engines, labels)
    batch_size = args.group_size * args.groups
    config = RolloutConfig(
        env_id="sokoban",
        env_config={"dim_room": [6, 6], "num_boxes": 1},
        group_size=args.group_size,
        batch_size=batch_size,
        concurrent_episodes=batch_size * (args.staleness + 1),
        max_staleness=args.staleness,
        seed=args.seed,
        episode=EpisodeSettings(
            max_turns=args.turns, max_context_tokens=2048, sampling=SamplingParams(max_new_tokens=16)
        ),
    )
    scheduler = RolloutScheduler(pool, router, tokenizer, config)
    steps: list[dict[str, float]] = []
    started_at = busy_at = 0.0
    try:
        for step in range(args.steps):
            if step == args.warmup:
                started_at, busy_at = time.perf_counter(), sum(e.stats()["busy_s"] for e in engines)
            t0 = time.perf_counter()
            batch = await scheduler.get_batch()
            t1 = time.perf_counter()
            aborted = 0
            if mode == "colocated":  # pause: generation stops, every replica frees its device
                await scheduler.suspend()
                await router.sleep()
            elif mode == "partial":  # pause: the training half steps aside, the other half generates on
                aborted = (await scheduler.shrink_sampler(["train"]))["aborted"]
            await asyncio.sleep(args.train_work / n_train)  # the update
            if mode == "partial":
                await scheduler.expand_sampler(["train"])
            await scheduler.suspend()  # publish: no reply from half-loaded weights
            if mode == "colocated":
                await router.wake()
            await router.load_weights({}, version=step + 1)
            await scheduler.resume()
            steps.append(
                {
                    "step_s": time.perf_counter() - t0,
                    "batch_wait_s": t1 - t0,
                    "aborted": aborted,
                    "episodes": batch.metrics["rollout/episodes"],
                    "staleness_mean": batch.metrics["rollout/staleness_mean"],
                }
            )
        wall = time.perf_counter() - started_at
        busy = sum(e.stats()["busy_s"] for e in engines) - busy_at
    finally:
        await scheduler.close()
    kept = steps[args.warmup :]
    counted = len(kept)
    gen_devices = len(set(labels)) if mode != "partial" else args.devices
    return {
        "mode": mode,
        "replicas": len(labels),
        "train_devices": n_train,
        "episodes_per_s": sum(s["episodes"] for s in kept) / wall,
        "step_s_median": statistics.median(s["step_s"] for s in kept),
        "batch_wait_s_median": statistics.median(s["batch_wait_s"] for s in kept),
        "gen_busy_fraction": busy / (gen_devices * wall),
        "device_utilisation": (busy + counted * args.train_work) / (args.devices * wall),
        "aborted_per_step": statistics.fmean(s["aborted"] for s in kept),
        "rerouted_total": router.counters["rerouted"],
        "staleness_mean": statistics.fmean(s["staleness_mean"] for s in kept),
        "dropped_groups_stale": scheduler.counter("dropped_stale"),
        "steps": steps,
    }


async def run(args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    server = EnvServer.run_in_thread(ServerConfig(env_ids=("sokoban",), port=0))
    out: dict[str, Any] = {}
    try:
        async with EnvPool([server.address], health_interval_s=1.0) as pool:
            for work in args.train_work:
                for profile in args.profiles:
                    print(f"== update {work} device-s, {profile} replies: {', '.join(MODES)} side by side ==")
                    setting = argparse.Namespace(**{**vars(args), "train_work": work})
                    results = await asyncio.gather(
                        *(train_loop(pool, tokenizer, setting, mode, profile == "long-tail") for mode in MODES)
                    )
                    by_mode = dict(zip(MODES, results, strict=True))
                    base = by_mode["colocated"]["episodes_per_s"]
                    for r in results:
                        r["episodes_per_s_vs_colocated"] = r["episodes_per_s"] / base
                    out[f"{work}/{profile}"] = {"train_work": work, "profile": profile, **by_mode}
    finally:
        server.stop()
    return out


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    lines = [
        "## Partial GPU overlap: colocated vs disaggregated vs partial (issue 19)",
        "",
        f"`{res['command']}` ({res['wall_s'] / 60:.1f} min): a model-free loop over {a['devices']} simulated "
        f"devices, each serving {a['slots']} replies at once ({a['reply_s']} s per reply; `long-tail`: "
        f"{TAIL_SHARE:.0%} of them take {TAIL_FACTOR:.0f}x longer); the update is the given device-seconds of "
        f"work (a batch's replies are {a['turns'] * a['groups'] * a['group_size'] * a['reply_s'] / a['slots']:.1f} "
        f"device-seconds); sleep and wake cost {a['swap_s']} s each. Sokoban 6x6, {a['turns']} turns, "
        f"{a['groups']} groups of {a['group_size']} per batch, `max_staleness` {a['staleness']}; "
        f"{a['steps']} steps per variant, the first {a['warmup']} not counted; the three variants run at the same "
        "time in one process. Colocated: every device generates, then all sleep and train. Disaggregated: half "
        "generate, half train. Partial: "
        "every device generates; the training half is shrunk for each update (its replies in flight are asked "
        "again of the other half) and expanded after it. Generation busy = share of generating-device time with "
        "a reply in flight; utilisation = (generation busy + update time) / (all devices x wall).",
        "",
        "| update device-s | replies | mode | replicas | episodes/s | vs colocated | step s (median) "
        "| batch wait s (median) | generation busy | device utilisation | aborted by shrink / step | staleness "
        "| dropped stale |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for by_mode in res["settings"].values():
        for mode in MODES:
            r = by_mode[mode]
            lines.append(
                f"| {by_mode['train_work']} | {by_mode['profile']} | {mode} | {r['replicas']} "
                f"| {r['episodes_per_s']:.1f} | **{r['episodes_per_s_vs_colocated']:.2f}x** | {r['step_s_median']:.2f} "
                f"| {r['batch_wait_s_median']:.2f} | {r['gen_busy_fraction']:.2f} | {r['device_utilisation']:.2f} "
                f"| {r['aborted_per_step']:.1f} | {r['staleness_mean']:.2f} | {r['dropped_groups_stale']:.0f} |"
            )
    lines += ["", f"{footer(res)}. Machine: {res['machine']['cpus']} CPUs (shared VM). JSON: `{res['json']}`."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=4, help="total devices (even): the same for every variant")
    ap.add_argument("--slots", type=int, default=4, help="replies a device serves at once")
    ap.add_argument("--reply-s", type=float, default=0.1, help="seconds per reply")
    ap.add_argument(
        "--train-work", type=float, nargs="+", default=[0.4, 1.6], help="the update's device-seconds of work (each)"
    )
    ap.add_argument("--swap-s", type=float, default=0.05, help="seconds to put a replica to sleep, or wake it")
    ap.add_argument("--steps", type=int, default=12, help="training steps per variant")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the statistics")
    ap.add_argument("--staleness", type=int, default=1, help="max_staleness of every variant")
    ap.add_argument("--turns", type=int, default=3, help="turns per episode (Sokoban rarely ends sooner)")
    ap.add_argument("--groups", type=int, default=4, help="groups per batch")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profiles", nargs="+", default=["uniform", "long-tail"], choices=["uniform", "long-tail"])
    ap.add_argument("--markdown", type=Path, default=Path("/tmp/partial_overlap_section.md"))
    args = ap.parse_args()
    if args.warmup >= args.steps:
        ap.error("--warmup must be smaller than --steps")
    if args.devices < 2 or args.devices % 2:
        ap.error("--devices must be even and >= 2 (half train in the disaggregated and partial variants)")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bench_tiny_model())
    bench_run = Run("partial-overlap")
    settings = asyncio.run(run(args, tokenizer))
    res = {
        "args": {k: v for k, v in vars(args).items() if k != "markdown"},
        "json": str(bench_run.path.relative_to(REPO)),
        "settings": settings,
    }
    path = bench_run.write(res)
    text = markdown(res)
    args.markdown.write_text(text)
    print(text)
    print(f"wrote {path} and {args.markdown}")


if __name__ == "__main__":
    main()
