"""`FailurePolicy`: what a failed episode costs, and when failures stop the run.

A failed episode (`EpisodeFailed` from the env client, a turn or episode deadline, an agent's `AgentFailed`:
`REPLAYED_FAILURES`) is replayed on a fresh session with the same seed, after a backoff that doubles with each failure
(at most 30 s, with jitter); when its ``episode_retries`` run out its group is dropped and replaced. A failure
while no endpoint serving the env is up is the outage's fault, not the episode's: it uses no retry and does not
count towards ``max_failed_groups_in_a_row``, and the replay waits in `EnvPool.open` (whose `EnvOutage` ends the
run after ``envs.outage_timeout_s``). ``max_failed_groups_in_a_row`` dropped groups in a row stop the run with
`EpisodesKeepFailing`, so `get_batch` raises rather than waits forever.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import grpc

from roll_lightning.env_client import EpisodeFailed, EpisodesKeepFailing
from roll_lightning.rollout.agent_runner import AgentFailed
from roll_lightning.rollout.config import RolloutConfig
from roll_lightning.rollout.lanes import LaneState

REPLAYED_FAILURES = (EpisodeFailed, TimeoutError, AgentFailed)
# Session creation refused for these reasons fails the same way everywhere: a config error, not a fault.
REFUSED_CONFIG = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


class FailurePolicy:
    def __init__(
        self, config: RolloutConfig, counters: dict[str, float], stop: Callable[[BaseException], None]
    ) -> None:
        """``counters``: where ``outage_waits`` and ``groups_failed_in_a_row`` are counted; ``stop``: ends the
        rollout with an error (every waiting `get_batch` raises it)."""
        self.config, self.counters, self._stop = config, counters, stop
        for name in ("outage_waits", "groups_failed_in_a_row"):
            self.counters.setdefault(name, 0)
        self.last_failure: BaseException | None = None
        self._jitter = random.Random()  # backoff jitter only: never the run's seeded streams

    def note(self, err: BaseException, lane: LaneState) -> bool:
        """Record a failed episode; True when no endpoint serving its env is up (an outage, not its fault)."""
        self.last_failure = err
        if isinstance(err, EpisodeFailed) and err.infrastructure and lane.in_outage():
            self.counters["outage_waits"] += 1
            return True
        return False

    def backoff_s(self, failures: int) -> float:
        """Wait before replay ``failures``: ``retry_backoff_s`` doubling per failure, at most 30 s, with jitter."""
        base = min(30.0, self.config.retry_backoff_s * 2 ** (failures - 1))
        return base * (0.5 + 0.5 * self._jitter.random())

    def group_completed(self) -> None:
        self.counters["groups_failed_in_a_row"] = 0

    def group_dropped(self) -> None:
        """A group was dropped because a member kept failing; too many in a row stop the run."""
        self.counters["groups_failed_in_a_row"] += 1
        if self.counters["groups_failed_in_a_row"] >= self.config.max_failed_groups_in_a_row:
            self._stop(
                EpisodesKeepFailing(
                    f"{int(self.counters['groups_failed_in_a_row'])} groups in a row were dropped because their "
                    f"episodes kept failing; last error: {self.last_failure!r}"
                )
            )
