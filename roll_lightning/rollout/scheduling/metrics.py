"""Rollout metrics of one batch under ``rollout/``, ``env/`` (faults included) and ``timing/``; counters named
``_total`` run since the start."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean
from typing import TYPE_CHECKING, Any

from roll_lightning.rollout.episodes.episode import Episode

if TYPE_CHECKING:
    from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler


def batch_metrics(
    episodes: Sequence[Episode],
    scheduler: RolloutScheduler,
    *,
    wall_s: float,
    engine_before: dict[str, float],
    engine_after: dict[str, float],
) -> dict[str, float]:
    per_episode = [ep.metrics() for ep in episodes]
    mean = _means(per_episode)

    generated = engine_after.get("generated_tokens", 0.0) - engine_before.get("generated_tokens", 0.0)
    busy = engine_after.get("busy_s", 0.0) - engine_before.get("busy_s", 0.0)
    version = scheduler.engine.policy_version
    out: dict[str, Any] = {
        "rollout/success_rate": mean("success"),
        "rollout/return_mean": mean("return"),
        "rollout/return_max": max((m["return"] for m in per_episode), default=0.0),
        "rollout/turns_mean": mean("turns"),
        # per reply (a one-token reply reads 1.0), not per episode
        "rollout/response_tokens_mean": (
            sum(m["response_tokens"] for m in per_episode) / max(1.0, sum(m["turns"] for m in per_episode))
        ),
        "rollout/truncated_reply_rate": (
            sum(m["truncated_replies"] for m in per_episode) / max(1.0, sum(m["turns"] for m in per_episode))
        ),
        "rollout/context_ended_rate": mean("context_ended"),
        "rollout/staleness_mean": fmean(version - ep.policy_version for ep in episodes) if episodes else 0.0,
        "rollout/policy_version": float(version),
        "rollout/episodes": float(len(episodes)),
        "rollout/gen_tokens_per_s": generated / wall_s if wall_s > 0 else 0.0,
        "rollout/engine_busy_fraction": min(1.0, busy / wall_s) if wall_s > 0 and busy else 0.0,
        "env/step_latency_s": mean("env_latency_s"),
        "env/reset_latency_s": mean("reset_latency_s"),
        "env/image_bytes": mean("image_bytes"),  # per step
        "timing/image_encode_s": sum(m["image_encode_s"] for m in per_episode),
        **fault_totals(scheduler),
        "timing/generate_latency_s": mean("generate_latency_s"),
        "timing/rollout_s": wall_s,
    }
    if "turn_cache_reused_tokens" in engine_after:  # the transformers engine's `TurnCache`
        reused, prefilled = (
            engine_after[f"turn_cache_{n}_tokens"] - engine_before.get(f"turn_cache_{n}_tokens", 0.0)
            for n in ("reused", "prefilled")
        )
        out["rollout/prompt_tokens_reused"] = reused / (reused + prefilled) if reused + prefilled else 0.0
    judged = [m["invalid_action_rate"] for m in per_episode if "invalid_action_rate" in m]
    if judged:  # agents' calls have no judge: no rate rather than a made-up 0
        out["rollout/invalid_action_rate"] = fmean(judged)
    out.update(tool_metrics(episodes))
    if scheduler.config.tagged:
        for lane in scheduler.lanes:
            out.update(
                tag_metrics(lane.tag, [m for m, ep in zip(per_episode, episodes, strict=True) if ep.tag == lane.tag])
            )
    return {k: float(v) for k, v in out.items()}


def tool_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Tool use in the batch (none without tool calls): calls per turn, the share refused, calls per tool."""
    turns = [t for ep in episodes for t in ep.turns]
    calls = [c for t in turns for c in t.tool_calls]
    if not calls:
        return {}
    refused = sum(r.is_error for t in turns for r in t.tool_results)
    out = {
        "rollout/tool_calls_per_turn": len(calls) / len(turns),
        "rollout/invalid_tool_call_rate": refused / len(calls),
    }
    for name in sorted({c.name or "(unparsed)" for c in calls}):
        out[f"rollout/tool_calls/{name}"] = float(sum((c.name or "(unparsed)") == name for c in calls))
    return out


# (namespace, name, per-episode key) each tag of a multi-env run logs, e.g. rollout/sokoban/success_rate
TAG_METRICS = (
    ("rollout", "success_rate", "success"),
    ("rollout", "return_mean", "return"),
    ("rollout", "turns_mean", "turns"),
    ("rollout", "invalid_action_rate", "invalid_action_rate"),
    ("env", "step_latency_s", "env_latency_s"),
    ("env", "reset_latency_s", "reset_latency_s"),
)


def tag_metrics(tag: str, per_episode: list[dict[str, float]]) -> dict[str, float]:
    """One tag's share of a batch: `TAG_METRICS` and its episode count."""
    mean = _means(per_episode)
    out = {
        f"{space}/{tag}/{name}": mean(key)
        for space, name, key in TAG_METRICS
        if all(key in m for m in per_episode)  # an agent's tag has no invalid-reply rate
    }
    out[f"rollout/{tag}/episodes"] = float(len(per_episode))
    return out


def _means(per_episode: list[dict[str, float]]) -> Callable[[str], float]:
    def mean(key: str) -> float:
        return fmean(m[key] for m in per_episode) if per_episode else 0.0

    return mean


def fault_totals(scheduler: RolloutScheduler) -> dict[str, float]:
    """The ``_total`` counters: dropped groups, replays, outage waits and the env pools' own."""
    return {
        "rollout/dropped_groups_stale_total": scheduler.counter("dropped_stale"),
        "env/episode_retries_total": float(scheduler.counters["episode_retries"]),
        "env/outage_waits_total": float(scheduler.counters["outage_waits"]),
        "env/dropped_groups_failed_total": scheduler.counter("dropped_failed"),
        **{f"env/{name}_total": float(value) for name, value in _pool_counters(scheduler).items()},
    }


def _pool_counters(scheduler: RolloutScheduler) -> dict[str, float]:
    """The env pools' counters, summed over the run's distinct pools."""
    totals: dict[str, float] = {}
    for pool in {id(lane.pool): lane.pool for lane in scheduler.lanes if lane.pool is not None}.values():
        for name, value in pool.counters().items():
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals
