"""`FailurePolicy`: replay backoff, outages and when dropped groups stop the run (docs/reliability.md)."""

from __future__ import annotations

import random
from collections.abc import Callable

import grpc

from roll_lightning.env_client import EpisodeFailed, EpisodesKeepFailing
from roll_lightning.rollout.agents.runner import AgentFailed, AgentsKeepFailing
from roll_lightning.rollout.config.rollout import RolloutConfig
from roll_lightning.rollout.scheduling.lanes import LaneState

REPLAYED_FAILURES = (EpisodeFailed, TimeoutError, AgentFailed)
# a session refused for these is a config error, not a fault
REFUSED_CONFIG = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


class FailurePolicy:
    def __init__(
        self, config: RolloutConfig, counters: dict[str, float], stop: Callable[[BaseException], None]
    ) -> None:
        """``stop``: ends the rollout with an error (every waiting `get_batch` raises it)."""
        self.config, self.counters, self._stop = config, counters, stop
        for name in ("outage_waits", "groups_failed_in_a_row"):
            self.counters.setdefault(name, 0)
        self.last_failure: BaseException | None = None
        self._jitter = random.Random()  # backoff jitter only: never the run's seeded streams

    def note(self, err: BaseException, lane: LaneState) -> bool:
        """Record a failure; True when no endpoint serving its env is up (an outage)."""
        self.last_failure = err
        if isinstance(err, EpisodeFailed) and err.infrastructure and lane.in_outage():
            self.counters["outage_waits"] += 1
            return True
        return False

    def backoff_s(self, failures: int) -> float:
        """``retry_backoff_s`` doubled per failure, at most 30 s, with jitter."""
        base = min(30.0, self.config.retry_backoff_s * 2 ** (failures - 1))
        return base * (0.5 + 0.5 * self._jitter.random())

    def group_completed(self) -> None:
        self.counters["groups_failed_in_a_row"] = 0

    def group_dropped(self) -> None:
        """Too many dropped groups in a row stop the run."""
        self.counters["groups_failed_in_a_row"] += 1
        if self.counters["groups_failed_in_a_row"] >= self.config.max_failed_groups_in_a_row:
            dropped = int(self.counters["groups_failed_in_a_row"])
            if isinstance(self.last_failure, AgentFailed):  # the agent program broke, not an env
                self._stop(
                    AgentsKeepFailing(
                        f"{dropped} groups in a row were dropped because the agent program kept failing; "
                        f"last: {self.last_failure}"
                    )
                )
                return
            self._stop(
                EpisodesKeepFailing(
                    f"{dropped} groups in a row were dropped because their episodes kept failing; "
                    f"last error: {self.last_failure!r}"
                )
            )
