"""Rollout metrics of one batch, under the fixed namespaces ``rollout/``, ``env/`` and ``timing/``: per batch,
except the counters named ``_total`` (since the run started)."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import TYPE_CHECKING, Any

from roll_lightning.rollout.episode import Episode

if TYPE_CHECKING:
    from roll_lightning.rollout.scheduler import RolloutScheduler


def batch_metrics(
    episodes: Sequence[Episode],
    scheduler: RolloutScheduler,
    *,
    wall_s: float,
    engine_before: dict[str, float],
    engine_after: dict[str, float],
) -> dict[str, float]:
    per_episode = [ep.metrics() for ep in episodes]

    def mean(key: str) -> float:
        return fmean(m[key] for m in per_episode) if per_episode else 0.0

    generated = engine_after.get("generated_tokens", 0.0) - engine_before.get("generated_tokens", 0.0)
    busy = engine_after.get("busy_s", 0.0) - engine_before.get("busy_s", 0.0)
    version = scheduler.engine.policy_version
    out: dict[str, Any] = {
        "rollout/success_rate": mean("success"),
        "rollout/return_mean": mean("return"),
        "rollout/return_max": max((m["return"] for m in per_episode), default=0.0),
        "rollout/turns_mean": mean("turns"),
        "rollout/invalid_action_rate": mean("invalid_action_rate"),
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
        # counted since the run started (the scheduler's counters), hence _total
        "rollout/episode_retries_total": float(scheduler.counters["episode_retries"]),
        "rollout/dropped_groups_failed_total": float(scheduler.queue.counters["dropped_failed"]),
        "rollout/dropped_groups_stale_total": float(scheduler.queue.counters["dropped_stale"]),
        "rollout/gen_tokens_per_s": generated / wall_s if wall_s > 0 else 0.0,
        "rollout/engine_busy_fraction": min(1.0, busy / wall_s) if wall_s > 0 and busy else 0.0,
        "env/step_latency_s": mean("env_latency_s"),
        "env/reset_latency_s": mean("reset_latency_s"),
        **{f"env/{name}_total": float(value) for name, value in scheduler.pool.counters().items()},
        "timing/generate_latency_s": mean("generate_latency_s"),
        "timing/rollout_s": wall_s,
    }
    return {k: float(v) for k, v in out.items()}
