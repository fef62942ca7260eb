"""Env server benchmark (issue 2): env steps/s in-process vs over gRPC, Sokoban generation time, server memory.

1. Throughput. 64 sessions of FrozenLake (4x4) and of Sokoban (6x6, 1 box) are played in lockstep turns (every
   session gets one reply per turn, as in a rollout), with random valid moves mixed with ~10% invalid replies;
   an episode that ends is reset with a fresh seed (reset time counts, reset calls are not counted as steps).
   Variants: in-process (`env.step` directly), and `EnvPool` with transport unary / batch / stream against a
   server in a separate process (the headline: client and server do not share a GIL) and on a thread of this
   process. Variants are interleaved per repeat (A,B,C,..,A,B,C,..) because the machine is noisy; we report the
   median steps/s over repeats, per-call latency p50/p99 (all repeats pooled) and CPU microseconds per step.
2. Sokoban level generation (`generate_level`, no cache) per size over many seeds: median, p90, max; GEM's
   generator side by side when `gem` imports here or in /tmp/gemvenv, else GEM's recorded reference numbers.
3. Server process RSS (psutil): at start, with N open idle sessions (created and reset once), and while 64
   sessions play N short episodes (RSS every N/10 episodes).
4. WebShop-lite: catalogue and bm25s index build time and `SearchIndex.search` latency over goal instructions and
   product titles; steps/s of 64 sessions played by a scripted shopper (`ShopAgent`: searches with words of the
   instruction, clicks results, sub-pages and back, options, buy, ~10% invalid replies) in-process vs `EnvPool`
   batch to a WebShop server process, lockstep and free-running, interleaved, medians; and the RSS of a fresh
   WebShop server process over N episodes (RSS every N/10 episodes), checked against a growth bound.

Run:  .venv/bin/python bench/env_throughput.py          (full, several minutes)
      .venv/bin/python bench/env_throughput.py --quick  (smoke, about 1 minute)
Prints tables and writes bench/results/env_throughput-<utc time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google.protobuf
import grpc
import numpy as np
import psutil

from env_servers.envs.sokoban.generator import generate_level
from env_servers.envs.webshop import SearchIndex, generate_catalogue
from env_servers.envs.webshop.search import TOP_K
from env_servers.registry import get_env
from env_servers.server import EnvServer, ServerConfig
from roll_lightning.env_client import EnvClient, EnvPool, EnvSession
from roll_lightning.env_client.local import launch_local_server
from roll_lightning.protocol.v1 import env_pb2 as pb

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402

SESSIONS = 64
ENVS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "frozenlake": ({}, ("Left", "Down", "Right", "Up")),
    "sokoban": ({"dim_room": [6, 6], "num_boxes": 1}, ("Up", "Down", "Left", "Right")),
}
INVALID = ("I would go left.", "<answer>Jump</answer>", "<answer></answer>")
GEN_SIZES = (((6, 6), 1), ((6, 6), 2), ((8, 8), 2), ((8, 8), 4), ((10, 10), 4))
# envs.md §3.1: GEM's generator, 12 seeds per size, medians in ms (max where recorded), this kind of 2-core box.
GEM_REFERENCE_MS = {"6x6/1": 3, "6x6/2": 20, "8x8/2": 69, "8x8/4": 2500, "10x10/4": 7400}
GEM_SCRIPT = """
import json, sys, time, warnings
warnings.simplefilter("ignore")
from gem.envs.game_env.sokoban.utils import generate_room
sizes, n, budget = json.loads(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
out = {}
for (h, w), boxes in sizes:
    times, start = [], time.perf_counter()
    for seed in range(n):  # GEM's reset: retry with seed + attempt until a room is made
        t = time.perf_counter()
        for attempt in range(50):
            try:
                generate_room(dim=(h, w), num_steps=int(1.7 * (h + w)), num_boxes=boxes, seed=seed + attempt)
                break
            except (RuntimeError, RuntimeWarning):
                pass
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget:  # 8x8/4 and 10x10/4 take seconds per level
            break
    out[f"{h}x{w}/{boxes}"] = times
print(json.dumps(out))
"""


def action_picker(moves: tuple[str, ...], seed: int) -> Callable[[], str]:
    """Random valid move, or ~10% of the time an invalid reply (the env's format penalty path)."""
    rng = random.Random(seed)
    return lambda: rng.choice(INVALID) if rng.random() < 0.1 else f"<answer>{rng.choice(moves)}</answer>"


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class Seeds:
    """Fresh episode seeds; each variant gets its own range so no variant hits another's level cache."""

    def __init__(self, base: int) -> None:
        self.next = base * 10_000_000

    def __call__(self) -> int:
        self.next += 1
        return self.next


def run_inprocess(envs: list[Any], pick: Callable[[], str], seeds: Seeds, duration: float) -> dict[str, Any]:
    lat: list[float] = []
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for env in envs:
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(pick())
            lat.append(time.perf_counter() - t0)
            if terminated or truncated:
                env.reset(seeds(), None)
        steps += len(envs)
    return {"steps": steps, "seconds": time.perf_counter() - start, "lat": lat}


async def run_grpc(
    sessions: list[EnvSession], pick: Callable[[], str], seeds: Seeds, duration: float
) -> dict[str, Any]:
    lat: list[float] = []

    async def timed_step(session: EnvSession) -> bool:
        t0 = time.perf_counter()
        out = await session.step(pick())
        lat.append(time.perf_counter() - t0)
        return out.done

    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        done = await asyncio.gather(*(timed_step(s) for s in sessions))
        await asyncio.gather(*(s.reset(seed=seeds()) for s, d in zip(sessions, done, strict=True) if d))
        steps += len(sessions)
    return {"steps": steps, "seconds": time.perf_counter() - start, "lat": lat}


async def run_grpc_free(
    sessions: list[EnvSession], pick: Callable[[], str], seeds: Seeds, duration: float
) -> dict[str, Any]:
    """Free-running episodes, as the async rollout drives them: each session steps (and resets) on its own,
    so the pool's adaptive batching overlaps client and server work instead of alternating turn by turn."""
    lat: list[float] = []
    counts = [0]
    start = time.perf_counter()
    stop = start + duration

    async def episode_loop(session: EnvSession) -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            out = await session.step(pick())
            lat.append(time.perf_counter() - t0)
            counts[0] += 1
            if out.done:
                await session.reset(seed=seeds())

    await asyncio.gather(*(episode_loop(s) for s in sessions))
    return {"steps": counts[0], "seconds": time.perf_counter() - start, "lat": lat}


def cpu_seconds(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    t = proc.cpu_times()
    return t.user + t.system


async def open_variants(
    env_id: str, addresses: dict[str, str], pools: list[EnvPool], transports: tuple[str, ...]
) -> dict[str, Any]:
    """name -> (duration -> awaitable run result) for one env; gRPC sessions are opened and reset here."""
    config, moves = ENVS[env_id]
    entry, pick = get_env(env_id), action_picker(moves, 0)
    envs = [entry.make(entry.make_config(config)) for _ in range(SESSIONS)]
    seeds = Seeds(1)
    for env in envs:
        env.reset(seeds(), None)
    loop = asyncio.get_running_loop()
    # In-process runs off the loop so the pools' health checks keep being answered meanwhile.
    variants = {"in-process": functools.partial(loop.run_in_executor, None, run_inprocess, envs, pick, seeds)}
    for where, address in addresses.items():
        for transport in transports:
            pool = EnvPool([address], transport=transport, health_interval_s=30.0)  # type: ignore[arg-type]
            await pool.start()
            pools.append(pool)
            sessions = list(await asyncio.gather(*(pool.open(env_id, config) for _ in range(SESSIONS))))
            seeds = Seeds(len(variants) + 1)
            await asyncio.gather(*(s.reset(seed=seeds()) for s in sessions))
            variants[f"{transport}/{where}"] = functools.partial(run_grpc, sessions, pick, seeds)
            if transport == "batch":  # the same sessions, free-running (how the rollout drives them)
                variants[f"batch-free/{where}"] = functools.partial(run_grpc_free, sessions, pick, seeds)
    return variants


async def bench_throughput(
    duration: float,
    repeats: int,
    server_pid: int,
    addresses: dict[str, str],
    env_ids: tuple[str, ...] = tuple(ENVS),
    transports: tuple[str, ...] = ("unary", "batch", "stream"),
) -> dict[str, Any]:
    me, server = psutil.Process(), psutil.Process(server_pid)
    results: dict[str, Any] = {}
    pools: list[EnvPool] = []
    for env_id in env_ids:
        variants = await open_variants(env_id, addresses, pools, transports)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for run in variants.values():  # warm-up: first-call costs (channels, caches) out of the numbers
            await run(min(0.3, duration))
        for _ in range(repeats):
            for name, run in variants.items():  # interleaved: A,B,C,D,A,B,C,D,...
                srv = server if name.endswith("/process") else None
                batches0, c0, s0 = sum(p.counters()["batches"] for p in pools), cpu_seconds(me), cpu_seconds(srv)
                out = await run(duration)
                out["client_cpu"], out["server_cpu"] = cpu_seconds(me) - c0, cpu_seconds(srv) - s0
                out["batches"] = sum(p.counters()["batches"] for p in pools) - batches0
                runs[name].append(out)
        results[env_id] = {name: summarize(rs) for name, rs in runs.items()}
        for r in results[env_id].values():
            r["ratio_to_in_process"] = r["steps_per_s"] / results[env_id]["in-process"]["steps_per_s"]
    for pool in pools:
        await pool.close()
    return results


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for r in runs for x in r["lat"]]
    steps = sum(r["steps"] for r in runs)
    return {
        "steps_per_s": statistics.median(r["steps"] / r["seconds"] for r in runs),
        "steps_per_s_repeats": [round(r["steps"] / r["seconds"], 1) for r in runs],
        "p50_ms": pct(lat, 50) * 1e3,
        "p99_ms": pct(lat, 99) * 1e3,
        "client_cpu_us_per_step": sum(r["client_cpu"] for r in runs) / steps * 1e6,
        "server_cpu_us_per_step": sum(r["server_cpu"] for r in runs) / steps * 1e6,
        # BatchStep + BatchReset RPCs per lockstep turn (batch transport only): 1.0 would be one RPC per turn.
        "rpcs_per_turn": (sum(r["batches"] for r in runs) / (steps / SESSIONS)) or None,
    }


def bench_generation(n_seeds: int, gem_budget_s: float) -> dict[str, Any]:
    ours: dict[str, list[float]] = {}
    for dim, boxes in GEN_SIZES:
        times = []
        for seed in range(n_seeds):
            t0 = time.perf_counter()
            generate_level(dim, boxes, seed)
            times.append(time.perf_counter() - t0)
        ours[f"{dim[0]}x{dim[1]}/{boxes}"] = times
    gem, gem_source = (
        run_gem(n_seeds, gem_budget_s) if gem_budget_s > 0 else (None, "recorded reference (envs.md §3.1, 12 seeds)")
    )
    return {
        "ours": {k: timing_stats(v) for k, v in ours.items()},
        "gem": {k: timing_stats(v) for k, v in gem.items()}
        if gem
        else {k: {"median_ms": v} for k, v in GEM_REFERENCE_MS.items()},
        "gem_source": gem_source,
    }


def timing_stats(seconds: list[float]) -> dict[str, float]:
    return {
        "n": len(seconds),
        "median_ms": pct(seconds, 50) * 1e3,
        "p90_ms": pct(seconds, 90) * 1e3,
        "max_ms": max(seconds) * 1e3,
    }


def run_gem(n_seeds: int, budget_s: float) -> tuple[dict[str, list[float]] | None, str]:
    """Time GEM's generator in a python that has `gem` (never a dependency of this project)."""
    for python in (sys.executable, "/tmp/gemvenv/bin/python"):
        if not Path(python).exists():
            continue
        if subprocess.run([python, "-c", "import gem"], capture_output=True).returncode != 0:
            continue
        sizes = json.dumps([[list(d), b] for d, b in GEN_SIZES])
        out = subprocess.run(
            [python, "-c", GEM_SCRIPT, sizes, str(n_seeds), str(budget_s)], capture_output=True, text=True
        )
        if out.returncode == 0:
            return json.loads(out.stdout.strip().splitlines()[-1]), f"measured now ({python})"
    return None, "recorded reference (envs.md §3.1, 12 seeds): gem not importable"


def rss_mb(pid: int) -> float:
    time.sleep(0.3)  # let in-flight frees settle
    return psutil.Process(pid).memory_info().rss / 2**20


async def bench_memory(n: int) -> dict[str, Any]:
    """RSS of fresh server processes: idle sessions, then short episodes on a fixed set of sessions."""
    args = ["--max-sessions", str(2 * n + 256), "--log-level", "WARNING"]
    out: dict[str, Any] = {"n": n}
    server = launch_local_server(["frozenlake", "sokoban"], extra_args=args)
    client = EnvClient(server.address)
    try:
        out["idle_rss_mb"] = {"start": rss_mb(server.process.pid)}
        gate, seed = asyncio.Semaphore(64), iter(range(1, 10**9))
        for env_id, (config, _) in ENVS.items():

            async def create(env_id: str = env_id, config: dict[str, Any] = config) -> str:
                req = pb.CreateSessionRequest(env_id=env_id, request_id=uuid.uuid4().hex)
                req.config.update(config)
                async with gate:
                    return (await client.create_session(req, 30.0)).session_id

            ids = await asyncio.gather(*(create() for _ in range(n)))
            out["idle_rss_mb"][f"+{n} {env_id} created"] = rss_mb(server.process.pid)
            for i in range(0, n, 256):  # one episode open in every session, then idle
                await client.batch_reset(
                    [
                        pb.ResetRequest(session_id=s, seed=next(seed), request_id=uuid.uuid4().hex)
                        for s in ids[i : i + 256]
                    ],
                    60.0,
                )
            out["idle_rss_mb"][f"+{n} {env_id} reset"] = rss_mb(server.process.pid)
    finally:
        await client.close()
        server.stop()
    server = launch_local_server(["frozenlake", "sokoban"], extra_args=args)
    try:
        async with EnvPool([server.address], transport="batch", health_interval_s=30.0) as pool:
            sessions = [await pool.open(e, {**ENVS[e][0], "max_steps": 5}) for e in ENVS for _ in range(SESSIONS // 2)]
            picks = [action_picker(ENVS[s.spec.env_id][1], i) for i, s in enumerate(sessions)]
            seeds = Seeds(99)
            await asyncio.gather(*(s.reset(seed=seeds()) for s in sessions))
            episodes, samples = 0, {0: rss_mb(server.process.pid)}
            while episodes < n:
                done = await asyncio.gather(*(s.step(p()) for s, p in zip(sessions, picks, strict=True)))
                ended = [s for s, o in zip(sessions, done, strict=True) if o.done]
                await asyncio.gather(*(s.reset(seed=seeds()) for s in ended))
                before, episodes = episodes, episodes + len(ended)
                if episodes // max(1, n // 10) != before // max(1, n // 10) or episodes >= n:
                    samples[episodes] = rss_mb(server.process.pid)
            out["episodes_rss_mb"] = samples
    finally:
        server.stop()
    return out


# ------------------------------------------------------------------------------------------------------------------
# WebShop-lite

WS_SEP = " [SEP] "
WS_INVALID = ("I would search for shoes.", "<answer>click[nothing here]</answer>", "search shoes", "<answer></answer>")
WS_FILLER = frozenset("i im i'm am looking for need want a an some the me please would like to get find".split())
WS_VARIANTS = ("in-process", "batch/process", "batch-free/process")
WS_MEMORY_BOUND_MB = 5.0  # RSS growth allowed from the first sample after 1/10 of the episodes to the last


class ShopAgent:
    """Scripted WebShop player that reads only the observation text, so it plays alike in-process and over gRPC.

    It searches with words of the instruction, clicks one of the first results (sometimes turns a page), on the
    item page sometimes reads a sub-page and comes back, selects the options the instruction names, and buys;
    sometimes it goes back to the results or to search instead. ~10% of replies are invalid.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def act(self, obs: str) -> tuple[str, str]:
        """(kind, reply) for the page in ``obs``; kind is "search", "click" or "invalid"."""
        rng = self.rng
        if rng.random() < 0.1:
            return "invalid", rng.choice(WS_INVALID)
        head, _, actions = obs.rpartition("\nAvailable actions: ")
        instruction = head.split(WS_SEP, 2)[1]
        if actions.startswith("search["):
            wanted = instruction.split(" with ", 1)[0].split(", and price", 1)[0]
            words = [w for w in wanted.replace(",", " ").split() if w not in WS_FILLER]
            n = rng.randint(min(2, len(words)), len(words))
            start = rng.randint(0, len(words) - n)
            return "search", f"<answer>search[{' '.join(words[start : start + n])}]</answer>"
        clicks = actions[len("click[") : -1].split("], click[")
        if "buy now" in clicks:  # item page
            todo = [c for c in clicks if f": {c}," in instruction and f"{c} (selected)" not in head]
            r = rng.random()
            if todo and r < 0.85:
                target = rng.choice(todo)
            elif r < 0.15:
                target = rng.choice(("description", "features", "reviews"))
            elif r < 0.22:
                target = "< prev"
            else:
                target = "buy now"
        elif clicks == ["back to search", "< prev"]:  # sub-page
            target = "< prev" if rng.random() < 0.9 else "back to search"
        else:  # results page
            asins = [c for c in clicks if c not in ("back to search", "< prev", "next >")]
            r = rng.random()
            if not asins or r < 0.03:
                target = "back to search"
            elif r < 0.1 and "next >" in clicks:
                target = "next >"
            else:
                target = rng.choices(asins[:3], weights=(0.6, 0.25, 0.15)[: len(asins[:3])])[0]
        return "click", f"<answer>click[{target}]</answer>"


def ws_run_result(start: float, lat: dict[str, list[float]], episodes: int, rewards: float) -> dict[str, Any]:
    """One timed run: steps and latencies (per action kind), finished episodes and their summed final reward."""
    return {
        "steps": sum(len(v) for v in lat.values()),
        "seconds": time.perf_counter() - start,
        "lat": [x for v in lat.values() for x in v],
        "lat_by_kind": lat,
        "episodes": episodes,
        "reward_sum": rewards,
    }


def ws_inprocess(
    envs: list[Any], agents: list[ShopAgent], obs: list[str], seeds: Seeds, duration: float
) -> dict[str, Any]:
    """Lockstep turns over in-process `WebShopEnv`s (the agent's time counts in steps/s, not in latency)."""
    lat: dict[str, list[float]] = {"search": [], "click": [], "invalid": []}
    episodes, rewards, start = 0, 0.0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for i, env in enumerate(envs):
            kind, reply = agents[i].act(obs[i])
            t0 = time.perf_counter()
            obs[i], reward, terminated, truncated, _ = env.step(reply)
            lat[kind].append(time.perf_counter() - t0)
            if terminated or truncated:
                episodes, rewards = episodes + 1, rewards + reward * terminated
                obs[i] = env.reset(seeds(), None)[0]
    return ws_run_result(start, lat, episodes, rewards)


async def ws_lockstep(
    sessions: list[EnvSession], agents: list[ShopAgent], obs: list[str], seeds: Seeds, duration: float
) -> dict[str, Any]:
    """Lockstep turns over gRPC: every session steps, then the ended ones reset."""
    lat: dict[str, list[float]] = {"search": [], "click": [], "invalid": []}
    episodes, rewards, start = 0, 0.0, time.perf_counter()

    async def timed_step(i: int) -> Any:
        kind, reply = agents[i].act(obs[i])
        t0 = time.perf_counter()
        out = await sessions[i].step(reply)
        lat[kind].append(time.perf_counter() - t0)
        obs[i] = out.observation
        return out

    async def reset(i: int) -> None:
        obs[i] = (await sessions[i].reset(seed=seeds())).observation

    while time.perf_counter() - start < duration:
        outs = await asyncio.gather(*(timed_step(i) for i in range(len(sessions))))
        ended = [i for i, o in enumerate(outs) if o.done]
        episodes += len(ended)
        rewards += sum(outs[i].reward for i in ended if outs[i].terminated)
        await asyncio.gather(*(reset(i) for i in ended))
    return ws_run_result(start, lat, episodes, rewards)


async def ws_free(
    sessions: list[EnvSession],
    agents: list[ShopAgent],
    obs: list[str],
    seeds: Seeds,
    duration: float | None,
    max_episodes: int | None = None,
    on_episode: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Free-running episodes over gRPC, for ``duration`` s or until ``max_episodes`` episodes have finished (the
    other sessions then stop mid-episode); ``on_episode(count)`` runs after each finished episode."""
    lat: dict[str, list[float]] = {"search": [], "click": [], "invalid": []}
    tally = {"episodes": 0, "rewards": 0.0}
    start = time.perf_counter()
    stop = start + duration if duration is not None else float("inf")

    def more() -> bool:
        return time.perf_counter() < stop and (max_episodes is None or tally["episodes"] < max_episodes)

    async def episode_loop(i: int) -> None:
        while more():
            kind, reply = agents[i].act(obs[i])
            t0 = time.perf_counter()
            out = await sessions[i].step(reply)
            lat[kind].append(time.perf_counter() - t0)
            obs[i] = out.observation
            if out.done:
                tally["episodes"] += 1
                tally["rewards"] += out.reward if out.terminated else 0.0
                if on_episode is not None:
                    on_episode(int(tally["episodes"]))
                obs[i] = (await sessions[i].reset(seed=seeds())).observation  # even at the end: sessions stay usable

    await asyncio.gather(*(episode_loop(i) for i in range(len(sessions))))
    return ws_run_result(start, lat, int(tally["episodes"]), float(tally["rewards"]))


def bench_ws_search(n_queries: int) -> dict[str, Any]:
    """Catalogue and index build time, then `SearchIndex.search` latency over goal instructions and titles."""
    t0 = time.perf_counter()
    catalogue = generate_catalogue()  # the default: 3000 products, seed 0
    t1 = time.perf_counter()
    index = SearchIndex(catalogue.products)
    t2 = time.perf_counter()
    rng = random.Random(0)
    queries = {
        "instruction": [g.instruction for g in rng.sample(catalogue.goals, n_queries // 2)],
        "title": [p.title for p in rng.sample(catalogue.products, n_queries - n_queries // 2)],
    }
    for q in queries["title"][:50]:  # warm-up
        index.search(q)
    lat: dict[str, list[float]] = {"instruction": [], "title": []}
    hits: list[int] = []
    for kind, qs in queries.items():
        for q in qs:
            t = time.perf_counter()
            found = index.search(q)
            lat[kind].append(time.perf_counter() - t)
            hits.append(len(found))
    every = lat["instruction"] + lat["title"]
    return {
        "products": len(catalogue.products),
        "goals": len(catalogue.goals),
        "catalogue_build_ms": (t1 - t0) * 1e3,
        "index_build_ms": (t2 - t1) * 1e3,
        "queries": len(every),
        "mean_hits": statistics.mean(hits),
        "all": timing_stats(every) | {"p99_ms": pct(every, 99) * 1e3},
        **{kind: timing_stats(v) | {"p99_ms": pct(v, 99) * 1e3} for kind, v in lat.items()},
    }


async def bench_ws_throughput(duration: float, repeats: int) -> dict[str, Any]:
    """Steps/s: in-process vs `EnvPool` batch transport (lockstep and free-running) to a WebShop server process."""
    server = launch_local_server(["webshop"], extra_args=["--log-level", "WARNING"])
    me, srv = psutil.Process(), psutil.Process(server.process.pid)
    entry = get_env("webshop")
    envs = [entry.make(entry.make_config({})) for _ in range(SESSIONS)]
    seeds = Seeds(11)
    obs_local = [env.reset(seeds(), None)[0] for env in envs]
    pool = EnvPool([server.address], transport="batch", health_interval_s=30.0)
    try:
        await pool.start()
        sessions = list(await asyncio.gather(*(pool.open("webshop") for _ in range(SESSIONS))))
        remote_seeds = Seeds(12)
        obs_remote = [r.observation for r in await asyncio.gather(*(s.reset(seed=remote_seeds()) for s in sessions))]
        loop = asyncio.get_running_loop()
        agents = {name: [ShopAgent(1000 * k + i) for i in range(SESSIONS)] for k, name in enumerate(WS_VARIANTS)}
        variants: dict[str, Callable[[float], Any]] = {
            "in-process": functools.partial(
                loop.run_in_executor, None, ws_inprocess, envs, agents["in-process"], obs_local, seeds
            ),
            "batch/process": functools.partial(
                ws_lockstep, sessions, agents["batch/process"], obs_remote, remote_seeds
            ),
            "batch-free/process": functools.partial(
                ws_free, sessions, agents["batch-free/process"], obs_remote, remote_seeds
            ),
        }
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        for run in variants.values():  # warm-up
            await run(min(0.3, duration))
        for _ in range(repeats):
            for name, run in variants.items():  # interleaved
                b0, c0 = pool.counters()["batches"], cpu_seconds(me)
                s0 = cpu_seconds(srv if name != "in-process" else None)
                out = await run(duration)
                out["client_cpu"] = cpu_seconds(me) - c0
                out["server_cpu"] = cpu_seconds(srv if name != "in-process" else None) - s0
                out["batches"] = pool.counters()["batches"] - b0
                runs[name].append(out)
    finally:
        await pool.close()
        server.stop()
    results = {name: ws_summarize(rs) for name, rs in runs.items()}
    for r in results.values():
        r["ratio_to_in_process"] = r["steps_per_s"] / results["in-process"]["steps_per_s"]
    return results


def ws_summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """`summarize` plus per-kind latency, the action mix and episode statistics."""
    out = summarize(runs)
    steps = sum(r["steps"] for r in runs)
    episodes = sum(r["episodes"] for r in runs)
    for kind in ("search", "click", "invalid"):
        lat = [x for r in runs for x in r["lat_by_kind"][kind]]
        out[f"{kind}_share"] = len(lat) / steps
        out[f"{kind}_p50_ms"], out[f"{kind}_p99_ms"] = pct(lat, 50) * 1e3, pct(lat, 99) * 1e3
    out["episodes"] = episodes
    out["steps_per_episode"] = steps / episodes if episodes else float("nan")
    out["mean_episode_reward"] = sum(r["reward_sum"] for r in runs) / episodes if episodes else float("nan")
    return out


async def bench_ws_memory(n: int) -> dict[str, Any]:
    """RSS of a fresh WebShop server process while 64 free-running sessions play ``n`` episodes."""
    server = launch_local_server(["webshop"], extra_args=["--log-level", "WARNING"])
    pid = server.process.pid
    out: dict[str, Any] = {"n": n, "start_rss_mb": rss_mb(pid)}
    try:
        async with EnvPool([server.address], transport="batch", health_interval_s=30.0) as pool:
            sessions = list(await asyncio.gather(*(pool.open("webshop") for _ in range(SESSIONS))))
            seeds = Seeds(13)
            obs = [r.observation for r in await asyncio.gather(*(s.reset(seed=seeds()) for s in sessions))]
            agents = [ShopAgent(50_000 + i) for i in range(SESSIONS)]
            samples, every = {0: rss_mb(pid)}, max(1, n // 10)
            marks = iter(range(every, n, every))
            mark = [next(marks, n)]

            def sample(count: int) -> None:
                if count >= mark[0] and count < n:
                    samples[count] = rss_mb(pid)  # blocks the loop briefly: every session pauses
                    mark[0] = next(marks, n)

            run = await ws_free(sessions, agents, obs, seeds, None, max_episodes=n, on_episode=sample)
            samples[run["episodes"]] = rss_mb(pid)
            out["episodes_rss_mb"] = samples
            out["steps"], out["seconds"] = run["steps"], run["seconds"]
    finally:
        server.stop()
    counts, values = zip(*out["episodes_rss_mb"].items(), strict=True)
    out["growth_mb"] = values[-1] - values[0]
    out["growth_after_first_tenth_mb"] = values[-1] - values[1]
    # Least-squares slope after the first tenth (warm-up excluded): what a per-episode leak would show as.
    out["slope_kb_per_episode"] = float(np.polyfit(counts[1:], values[1:], 1)[0]) * 1024
    out["bound_mb"] = WS_MEMORY_BOUND_MB
    return out


def versions() -> dict[str, Any]:
    """Added to the run's machine block."""
    return {"grpcio": grpc.__version__, "protobuf": google.protobuf.__version__, "numpy": np.__version__}


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(f"\n# env_throughput  {res['started_utc']}  `{res['command']}`")
    print(f"# {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, grpcio {m['grpcio']}, ", end="")
    print(f"protobuf {m['protobuf']}, load average {m['load_start'][0]:.1f} at start")
    head = ("variant", "steps/s", "vs in-proc", "p50 ms", "p99 ms", "cli us/st", "srv us/st", "RPC/turn")
    for env_id, rows in res["throughput"].items():
        print(
            f"\n## {env_id}: {SESSIONS} sessions, lockstep turns; batch-free = free-running episodes "
            f"(median of {res['repeats']} x {res['duration_s']} s)"
        )
        print(f"{head[0]:<16}" + "".join(f"{h:>11}" for h in head[1:]))
        for name, r in rows.items():
            rpt = f"{r['rpcs_per_turn']:.2f}" if r["rpcs_per_turn"] else "-"
            cells = (f"{r['steps_per_s']:.0f}", f"{r['ratio_to_in_process']:.1%}", f"{r['p50_ms']:.3f}",
                     f"{r['p99_ms']:.3f}", f"{r['client_cpu_us_per_step']:.1f}", f"{r['server_cpu_us_per_step']:.1f}",
                     rpt)  # fmt: skip
            print(f"{name:<16}" + "".join(f"{c:>11}" for c in cells))
    for name in ("batch/process", "batch-free/process"):
        fl = res["throughput"].get("frozenlake", {}).get(name, {}).get("ratio_to_in_process")
        if fl is not None:
            print(f"target FrozenLake {name} >= 50% of in-process: {fl:.1%} -> {verdict(fl >= 0.5)}")
    if "generation" not in res:  # --only throughput
        return
    g = res["generation"]
    print(f"\n## Sokoban generation (ours: {res['gen_seeds']} seeds; GEM: {g['gem_source']})")
    head = ("size", "median ms", "p90 ms", "max ms", "GEM med", "GEM p90", "GEM max", "GEM n", "speedup")
    print(f"{head[0]:<9}" + "".join(f"{h:>10}" for h in head[1:]))
    for size, r in g["ours"].items():
        o = g["gem"].get(size, {})
        cells = [f"{r[k]:.2f}" for k in ("median_ms", "p90_ms", "max_ms")]
        cells += [f"{o[k]:.{0 if k == 'n' else 1}f}" if k in o else "-" for k in ("median_ms", "p90_ms", "max_ms", "n")]
        print(f"{size:<9}" + "".join(f"{c:>10}" for c in cells) + f"{o['median_ms'] / r['median_ms']:>9.0f}x")
    a, b = g["ours"]["6x6/1"]["median_ms"], g["ours"]["8x8/4"]["median_ms"]
    print(f"targets: 6x6/1 median < 5 ms: {a:.2f} ms {verdict(a < 5)}; 8x8/4 < 200 ms: {b:.1f} ms {verdict(b < 200)}")
    n, idle = res["memory"]["n"], res["memory"]["idle_rss_mb"]
    print(f"\n## Server process RSS (MB), {n} sessions per env")
    for k, v in idle.items():
        print(f"  {k:<28}{v:>8.1f}")
    for env_id, prev in (("frozenlake", idle["start"]), ("sokoban", idle[f"+{n} frozenlake reset"])):
        delta = idle[f"+{n} {env_id} reset"] - prev
        kb, at_10k = delta * 1024 / n, idle["start"] + delta * 10_000 / n
        print(f"  {env_id}: {kb:.1f} KB per idle session (target <= 50 KB) {verdict(kb <= 50)}; "
              f"10k sessions -> {at_10k:.0f} MB RSS (target < 500 MB) {verdict(at_10k < 500)}")  # fmt: skip
    samples = ", ".join(f"{k}: {v:.1f}" for k, v in res["memory"]["episodes_rss_mb"].items())
    print(f"  RSS after k short episodes on 64 sessions: {samples}")
    report_webshop(res["webshop"], res["repeats"], res["duration_s"])


def report_webshop(ws: dict[str, Any], repeats: int, duration: float) -> None:
    """Print the WebShop-lite tables: search latency, steps/s per variant, server RSS over episodes."""
    s = ws["search"]
    print(f"\n## WebShop-lite search: {s['products']} products, {s['goals']} goals; catalogue built in "
          f"{s['catalogue_build_ms']:.0f} ms, bm25s index in {s['index_build_ms']:.0f} ms")  # fmt: skip
    print(f"{'queries':<24}{'n':>6}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for kind, label in (("instruction", "goal instructions"), ("title", "product titles"), ("all", "all")):
        r = s[kind]
        cells = (f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", f"{r['p99_ms']:.3f}", f"{r['max_ms']:.3f}")
        print(f"{label:<24}{r['n']:>6}" + "".join(f"{c:>9}" for c in cells))
    print(f"mean hits per query {s['mean_hits']:.1f} (top {TOP_K})")
    print(f"\n## WebShop-lite steps/s: {SESSIONS} sessions, scripted agent; batch = lockstep turns, batch-free = "
          f"free-running episodes (median of {repeats} x {duration} s)")  # fmt: skip
    head = ("variant", "steps/s", "vs in-proc", "p50 ms", "p99 ms", "search p50", "search p99", "click p50",
            "cli us/st", "srv us/st", "RPC/64 st")  # fmt: skip
    print(f"{head[0]:<19}" + "".join(f"{h:>11}" for h in head[1:]))
    for name, r in ws["throughput"].items():
        rpt = f"{r['rpcs_per_turn']:.2f}" if r["rpcs_per_turn"] else "-"
        cells = (f"{r['steps_per_s']:.0f}", f"{r['ratio_to_in_process']:.1%}", f"{r['p50_ms']:.3f}",
                 f"{r['p99_ms']:.3f}", f"{r['search_p50_ms']:.3f}", f"{r['search_p99_ms']:.3f}",
                 f"{r['click_p50_ms']:.3f}", f"{r['client_cpu_us_per_step']:.1f}",
                 f"{r['server_cpu_us_per_step']:.1f}", rpt)  # fmt: skip
        print(f"{name:<19}" + "".join(f"{c:>11}" for c in cells))
    for name, r in ws["throughput"].items():
        print(f"  {name}: steps {r['search_share']:.0%} search / {r['click_share']:.0%} click / "
              f"{r['invalid_share']:.0%} invalid; {r['episodes']} episodes, {r['steps_per_episode']:.1f} steps "
              f"each, mean reward {r['mean_episode_reward']:.2f}")  # fmt: skip
    m = ws["memory"]
    print(f"\n## WebShop server RSS (MB): start {m['start_rss_mb']:.1f}; 64 free-running sessions, {m['n']} episodes "
          f"({m['steps']} steps in {m['seconds']:.0f} s)")  # fmt: skip
    print("  " + ", ".join(f"{k}: {v:.1f}" for k, v in m["episodes_rss_mb"].items()))
    ok = m["growth_after_first_tenth_mb"] <= m["bound_mb"]
    print(f"  growth {m['growth_mb']:+.1f} MB over all episodes, {m['growth_after_first_tenth_mb']:+.1f} MB after the "
          f"first tenth (bound <= {m['bound_mb']:.0f} MB) {verdict(ok)}; slope after the first tenth "
          f"{m['slope_kb_per_episode']:+.3f} KB/episode")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run (about 1 minute)")
    parser.add_argument(
        "--only-throughput", action="store_true", help="section 1 only (env steps/s); skip generation, memory, WebShop"
    )
    parser.add_argument("--envs", default=",".join(ENVS), help="section 1: comma-separated env ids (default: all)")
    parser.add_argument(
        "--transports", default="unary,batch,stream", help="section 1: comma-separated gRPC transports (default: all)"
    )
    parser.add_argument("--no-thread", action="store_true", help="section 1: skip the server-on-a-thread variants")
    parser.add_argument("--repeats", type=int, help="override the number of interleaved repeats")
    args = parser.parse_args()
    duration, repeats = (0.4, 3) if args.quick else (2.0, 5)
    repeats = args.repeats or repeats
    gen_seeds, gem_budget = (10, 0.0) if args.quick else (40, 40.0)  # quick: GEM's recorded numbers only
    mem_n = 1000 if args.quick else 10_000
    ws_queries = 500 if args.quick else 2000
    bench_run = Run("env_throughput", quick=args.quick)
    res: dict[str, Any] = {"machine": versions(), "duration_s": duration, "repeats": repeats, "gen_seeds": gen_seeds}
    t0 = time.perf_counter()
    proc_server = launch_local_server(["frozenlake", "sokoban"], extra_args=["--log-level", "WARNING"])
    thread_server = (
        None if args.no_thread else EnvServer.run_in_thread(ServerConfig(env_ids=("frozenlake", "sokoban"), port=0))
    )
    try:
        addresses = {"process": proc_server.address}
        if thread_server is not None:
            addresses["thread"] = thread_server.address
        env_ids, transports = tuple(args.envs.split(",")), tuple(args.transports.split(","))
        res["throughput"] = asyncio.run(
            bench_throughput(duration, repeats, proc_server.process.pid, addresses, env_ids, transports)
        )
    finally:
        if thread_server is not None:
            thread_server.stop()
        proc_server.stop()
    res["seconds"] = {"throughput": time.perf_counter() - t0}
    if args.only_throughput:
        finish(res, bench_run)
        return
    res["generation"] = bench_generation(gen_seeds, gem_budget)
    res["seconds"]["generation"] = time.perf_counter() - t0 - sum(res["seconds"].values())
    res["memory"] = asyncio.run(bench_memory(mem_n))
    res["seconds"]["memory"] = time.perf_counter() - t0 - sum(res["seconds"].values())
    res["webshop"] = {"search": bench_ws_search(ws_queries)}
    res["webshop"]["throughput"] = asyncio.run(bench_ws_throughput(duration, repeats))
    res["webshop"]["memory"] = asyncio.run(bench_ws_memory(mem_n))
    res["seconds"]["webshop"] = time.perf_counter() - t0 - sum(res["seconds"].values())
    finish(res, bench_run)


def finish(res: dict[str, Any], bench_run: Run) -> None:
    """Write the JSON and print the tables."""
    path = bench_run.write(res)
    report(res)
    print(f"\nphases (s): {', '.join(f'{k} {v:.0f}' for k, v in res['seconds'].items())}")
    print(bench_run.footer())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
