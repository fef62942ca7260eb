"""`RolloutConfig`: everything about how episodes are collected, validated up front with errors that name the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from roll_lightning.rollout.episode import EpisodeSettings
from roll_lightning.rollout.filters import GroupFilterConfig

GROUP_ESTIMATORS = ("grpo", "gigpo")


class RolloutConfigError(ValueError):
    """A rollout setting that cannot work; the message names the key."""


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are collected.

    Args:
        env_id: the env every episode plays, as registered on the env servers. Built in: ``sokoban``,
            ``frozenlake``, ``webshop``, ``gem:<id>`` (a GEM game), ``gym:<id>``; ``python -m env_servers describe
            ID`` prints one's spec and config keys (for ``env_config``).
        env_config: per-session env config (validated by the server against its schema).
        group_size: episodes per group; all start from the same seed.
        group_redundancy: extra members started per group; the first ``group_size`` to finish are kept.
        batch_size: trajectories (episodes) per `get_batch`; a multiple of ``group_size``.
        concurrent_episodes: episodes running at once (async mode).
        max_staleness: how many policy versions old a group's oldest reply may be (0 = strictly on-policy: the
            scheduler starts only the groups the current batch needs).
        episode_retries: a failed episode (env fault, timeout) is replayed on a fresh session with the same seed
            this many times; then its whole group is dropped. Failures while every env endpoint is down use no
            retry (the replay waits for an endpoint, up to ``envs.outage_timeout_s``).
        retry_backoff_s: wait before the first replay of a failed episode; doubled for each further failure of
            the same episode (at most 30 s), with jitter, so a struggling server is not hammered.
        max_failed_groups_in_a_row: after this many groups dropped for failures in a row, `get_batch` raises
            instead of retrying forever (e.g. every env server is gone).
        turn_timeout_s: deadline of one reply from the engine.
        episode_timeout_s: deadline of one whole episode.
        mode: ``async`` (every episode runs on its own) or ``lockstep`` (all episodes of a batch take each turn
            together; the generation waits for the slowest env: for debugging and as a baseline).
        seed: the run's seed; group g's seed is derived from (seed, g), so runs and resumes are reproducible.
        group_filter: dynamic sampling: which complete groups a batch keeps (``kind: zero_variance`` drops groups
            whose members all scored the same and plays replacements; ``top_p_variance`` over-samples and keeps
            the groups with the largest score spread). Off (``none``) by default; see `rollout.filters`.
        episode: layout, max turns, context budget, sampling, prompt rendering.
    """

    env_id: str = "sokoban"
    env_config: dict[str, Any] = field(default_factory=dict)
    group_size: int = 8
    group_redundancy: int = 0
    batch_size: int = 64
    concurrent_episodes: int = 64
    max_staleness: int = 0
    episode_retries: int = 2
    retry_backoff_s: float = 0.5
    max_failed_groups_in_a_row: int = 8
    turn_timeout_s: float = 600.0
    episode_timeout_s: float = 3600.0
    mode: Literal["async", "lockstep"] = "async"
    seed: int = 0
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    group_filter: GroupFilterConfig = field(default_factory=GroupFilterConfig)

    def __post_init__(self) -> None:
        positive = ("group_size", "batch_size", "concurrent_episodes", "max_failed_groups_in_a_row")
        for name in positive:
            if getattr(self, name) < 1:
                raise RolloutConfigError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("group_redundancy", "max_staleness", "episode_retries", "retry_backoff_s"):
            if getattr(self, name) < 0:
                raise RolloutConfigError(f"rollout.{name} must be >= 0, got {getattr(self, name)}")
        if self.batch_size % self.group_size:
            raise RolloutConfigError(
                f"rollout.batch_size={self.batch_size} is not divisible by rollout.group_size={self.group_size}: "
                "a batch holds whole groups"
            )
        if self.mode not in ("async", "lockstep"):
            raise RolloutConfigError(f"rollout.mode must be 'async' or 'lockstep', got {self.mode!r}")
        if self.episode.layout not in ("trajectory", "step"):
            raise RolloutConfigError(
                f"rollout.episode.layout must be 'trajectory' or 'step', got {self.episode.layout!r}"
            )
        if self.episode.max_turns < 1:
            raise RolloutConfigError(f"rollout.episode.max_turns must be >= 1, got {self.episode.max_turns}")
        if self.episode.max_context_tokens <= self.episode.sampling.max_new_tokens:
            raise RolloutConfigError(
                f"rollout.episode.max_context_tokens={self.episode.max_context_tokens} leaves no room for a prompt "
                f"next to max_new_tokens={self.episode.sampling.max_new_tokens}: one turn must fit"
            )
        self.group_filter.check(self.group_size)
        for name in ("turn_timeout_s", "episode_timeout_s"):
            if getattr(self, name) <= 0:
                raise RolloutConfigError(f"rollout.{name} must be > 0, got {getattr(self, name)}")

    @property
    def groups_per_batch(self) -> int:
        return self.batch_size // self.group_size

    def check_estimator(self, estimator: str) -> None:
        """Group-normalised estimators compare members of a group: a group of one has nothing to compare."""
        if estimator in GROUP_ESTIMATORS and self.group_size < 2:
            raise RolloutConfigError(
                f"rollout.group_size={self.group_size}: the '{estimator}' estimator normalises within groups and "
                "needs group_size >= 2"
            )
