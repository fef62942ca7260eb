"""One group's members under ``data.rollout.branch`` (`rollout.config.branching`): spines play from the reset and
fork before branch turns; the other members wait for a fork to continue, or play from the reset once no spine can
fork any more. Every member is still one `Episode`, so a group keeps its size and the queue, filters, staleness
and resume treat it as any group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from roll_lightning.env_client.errors import EpisodeFailed
from roll_lightning.env_client.session import EnvSession
from roll_lightning.rollout.config.branching import BranchSettings
from roll_lightning.rollout.episodes.episode import BranchPoint, Episode, EpisodeBuilder
from roll_lightning.rollout.errors import RolloutConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BranchStart:
    """A forked member's start: its own copy of the env session and of the conversation."""

    session: EnvSession
    builder: EpisodeBuilder


class BranchPlan:
    """Which members of one group are spines, which wait for a fork, and the forks made."""

    def __init__(self, settings: BranchSettings, group_size: int) -> None:
        loop = asyncio.get_running_loop()
        self.settings = settings
        self.free = list(range(settings.spines, group_size))  # members no fork has taken yet, in order
        self._starts: dict[int, asyncio.Future[BranchStart | None]] = {m: loop.create_future() for m in self.free}
        self.spines_running = settings.spines
        self.copies = 0  # members started from a fork
        self.forks = 0  # ForkSession calls
        self.refused = 0  # forks the server refused (the spine played on unforked)
        self.fork_s = 0.0  # their time, in all

    def is_spine(self, member: int) -> bool:
        return member < self.settings.spines

    async def start_of(self, member: int) -> BranchStart | None:
        """A waiting member's start: a fork, or None (play from the reset) once every spine has ended."""
        return await self._starts[member]

    def spine_ended(self) -> None:
        """A spine played its last attempt: when none is left, the members still free play from the reset."""
        self.spines_running -= 1
        if self.spines_running == 0:
            for member in self._waiting():
                self._starts[member].set_result(None)
            self.free = []

    def _waiting(self) -> list[int]:
        """The free members whose tasks still wait (a cancelled task's start is cancelled with it)."""
        return [m for m in self.free if not self._starts[m].done()]

    async def fork_spine(self, session: EnvSession, builder: EpisodeBuilder) -> None:
        """`run_episode`'s ``before_turn`` for a spine: before a branch turn, fork into up to ``width - 1`` free
        members, each handed its copy of the session and of the conversation."""
        turn, turns = builder.turn, builder.turns
        self.free = self._waiting()
        if not self.free or not self.settings.forks_before(turn, turns[-1].logprobs if turns else ()):
            return
        why = session.unforkable()
        if why:
            raise RolloutConfigError(f"data.rollout.branch needs a forkable env: {why}")
        members, self.free = self.free[: self.settings.width - 1], self.free[self.settings.width - 1 :]
        started = time.perf_counter()
        try:
            copies = await session.fork(len(members))
        except EpisodeFailed as err:
            self.free = sorted(members + self.free)
            self.refused += 1  # a full server, say: the spine plays on unforked, its members later from the reset
            log.debug("fork refused, playing on unforked: %s", err)
            return
        self.forks += 1
        self.fork_s += time.perf_counter() - started
        spine = builder.episode
        point = BranchPoint(f"{spine.traj_key}#{spine.attempts}", turn, sum(t.reward for t in builder.turns))
        for member, twin in zip(members, copies, strict=True):
            if self._starts[member].done():  # its task was cancelled meanwhile (the group was dropped)
                await twin.close()
                continue
            episode = Episode(spine.group_index, member, spine.seed, spine.env_id, tag=spine.tag, branch=point)
            self._starts[member].set_result(BranchStart(twin, builder.fork(episode)))
            self.copies += 1
