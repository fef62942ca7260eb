"""`RolloutScheduler`: keeps episodes running and hands out batches of complete groups.

Async mode: every episode is its own task on the scheduler's asyncio loop; the engine batches whatever replies
are pending, the env pool batches whatever steps are pending, so neither waits for the slowest episode. The
scheduler starts only as many groups as waiting `get_batch` calls need plus ``max_staleness`` batches ahead.
Lock-step mode (`lockstep.py`) plays a batch turn by turn instead.

Faults: a failed episode (`EpisodeFailed` from the env client, a turn or episode deadline) is replayed on a
fresh session with the same seed, after a backoff that doubles with each failure; when its retries run out the
whole group is dropped and replaced. A failure while every env endpoint is down is not the episode's fault and
uses no retry: the replay waits in `EnvPool.open` for an endpoint to come back, and the pool's `EnvOutage`
(down longer than ``envs.outage_timeout_s``) stops the run with one message. Nothing partial is ever returned,
and `get_batch` raises rather than hangs when groups keep failing.

Every episode task holds one running slot from its creation until it is done, however it ends (finished,
failed, or cancelled before it ever ran): the slot is given back by the task's done-callback, which also wakes
the producer, so `get_batch` never waits with nothing left that could wake it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import grpc
import numpy as np

from roll_lightning.envs import EnvOutage, EnvPool, EnvSession, EpisodeFailed, EpisodesKeepFailing
from roll_lightning.rollout.batch import RolloutBatch, collate
from roll_lightning.rollout.config import RolloutConfig, RolloutConfigError
from roll_lightning.rollout.engines.base import EngineClosed, Generation, GenerationEngine, SamplingParams
from roll_lightning.rollout.episode import ContextBudgetError, Episode, EpisodeBuilder, run_episode
from roll_lightning.rollout.filters import GroupSelection
from roll_lightning.rollout.groups import Group, GroupQueue
from roll_lightning.rollout.metrics import batch_metrics

log = logging.getLogger(__name__)

RETRYABLE = (EpisodeFailed, TimeoutError)
# Session creation refused for these reasons fails the same way everywhere: a config error, not a fault.
REFUSED_CONFIG = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)


Split = Literal["train", "eval"]


def group_seed(run_seed: int, group_index: int, split: Split = "train") -> int:
    """The env seed of group ``group_index``: a pure function of the run seed, so resume and ranks agree.

    Training seeds are even and evaluation seeds odd, so evaluation always plays starts training never saw.
    """
    value = int(np.random.SeedSequence([run_seed, group_index]).generate_state(1)[0] & 0x7FFF_FFFF)
    return value | 1 if split == "eval" else value & ~1


class RolloutScheduler:
    def __init__(
        self,
        pool: EnvPool,
        engine: GenerationEngine,
        tokenizer: Any,
        config: RolloutConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        stop_token_ids: Sequence[int] = (),
        split: Split = "train",
    ) -> None:
        """Create on the asyncio loop that will run it. Rank ``r`` of ``world_size`` plays groups r, r+W, ...;
        ``split`` picks the seed space (``eval`` seeds are disjoint from ``train`` seeds)."""
        self.pool, self.engine, self.tokenizer, self.config = pool, engine, tokenizer, config
        self.rank, self.world_size, self.split = rank, world_size, split
        stops = {tokenizer.eos_token_id, *config.episode.sampling.stop_token_ids, *stop_token_ids}
        self.stop_ids = {s for s in stops if s is not None}
        self.queue = GroupQueue(config.max_staleness)
        self.filter = config.group_filter.build()
        self.counters: dict[str, float] = {
            "episodes": 0,
            "episode_retries": 0,
            "redundant_cancelled": 0,
            "groups_failed_in_a_row": 0,
            "outage_waits": 0,  # failures while every endpoint was down: replayed without using a retry
        }
        # Resume bookkeeping over *local* group numbers: all below the watermark are consumed or dropped.
        self._next_local = 0
        self._watermark = 0
        self._settled_above: set[int] = set()
        self._restart: deque[int] = deque()
        self._demand = 0
        self._episodes: set[asyncio.Task[None]] = set()  # each holds a running slot until done
        self._idle_sessions: list[EnvSession] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._kick = asyncio.Event()
        self._generation_open = asyncio.Event()
        self._generation_open.set()
        self._in_flight = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self._producer: asyncio.Task[None] | None = None
        self._last_failure: BaseException | None = None
        self._jitter = random.Random()  # backoff jitter only: never the run's seeded streams
        self.batches = 0

    # -- public API ----------------------------------------------------------------------------------

    async def get_batch(self, n: int | None = None) -> RolloutBatch:
        """Wait for ``n`` trajectories (default ``config.batch_size``) of complete, fresh groups."""
        n = self.config.batch_size if n is None else n
        if n % self.config.group_size:
            raise ValueError(f"get_batch({n}): not a multiple of group_size={self.config.group_size}")
        started = time.perf_counter()
        before = self.engine.stats()
        selection = GroupSelection(self.filter, n // self.config.group_size)
        if self.config.mode == "lockstep":
            from roll_lightning.rollout.lockstep import collect_lockstep

            await collect_lockstep(self, selection)
        else:
            await self._take(selection)
        groups, filtered, filter_metrics = selection.result()
        for group in [*groups, *filtered]:  # filtered groups are settled too: never replayed after a resume
            self._settle(group.index)
        episodes = [ep for g in groups for ep in sorted(g.episodes, key=lambda e: e.member)[: g.size]]
        batch = collate(episodes, self.config.episode.layout, _pad_id(self.tokenizer))
        batch.metrics = batch_metrics(
            episodes, self, wall_s=time.perf_counter() - started, engine_before=before, engine_after=self.engine.stats()
        )
        batch.metrics.update(filter_metrics)
        self.batches += 1
        return batch

    async def suspend(self) -> None:
        """Hold new replies and wait for the ones in flight (before weights change or the engine sleeps)."""
        self._generation_open.clear()
        await self._drained.wait()

    async def resume(self) -> None:
        """Let generation go on; groups now too stale for the engine's policy version are dropped."""
        for group in self.queue.expire(self.engine.policy_version):
            self._abandon(group)
        self._generation_open.set()
        self._kick.set()

    async def close(self) -> None:
        if self._producer is not None:
            self._producer.cancel()
        for group in list(self.queue.live.values()):
            for task in group.tasks:
                task.cancel()
        tasks = [t for g in self.queue.live.values() for t in g.tasks] + list(self._background)
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self._idle_sessions), return_exceptions=True)
        self._idle_sessions.clear()

    def state_dict(self) -> dict[str, Any]:
        """Where the run is in its sequence of groups (consumed or dropped groups are never replayed, started
        but unconsumed ones are replayed after a resume, none is skipped)."""
        return {
            "next_local": self._next_local,
            "watermark": self._watermark,
            "settled_above": sorted(self._settled_above),
            "batches": self.batches,
            "seed": self.config.seed,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("seed") != self.config.seed or state.get("world_size") != self.world_size:
            raise ValueError(
                f"rollout state was saved with seed={state.get('seed')}, world_size={state.get('world_size')}; "
                f"this run has seed={self.config.seed}, world_size={self.world_size}"
            )
        self._next_local, self._watermark = state["next_local"], state["watermark"]
        self._settled_above = set(state["settled_above"])
        self._restart = deque(i for i in range(self._watermark, self._next_local) if i not in self._settled_above)
        self.batches = state["batches"]

    @property
    def running(self) -> int:
        """Episode tasks holding a running slot now."""
        return len(self._episodes)

    # -- generation gate -----------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """The engine behind the suspend/resume gate (what episodes call)."""
        await self._generation_open.wait()
        self._in_flight += 1
        self._drained.clear()
        try:
            return await self.engine.generate(prompt_ids, params, key=key)
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._drained.set()

    # -- groups --------------------------------------------------------------------------------------

    def new_group(self) -> Group:
        local = self._restart.popleft() if self._restart else self._take_next_local()
        index = local * self.world_size + self.rank
        seed = group_seed(self.config.seed, index, self.split)
        group = Group(index, seed, self.config.group_size, self.engine.policy_version)
        self.queue.add(group)
        return group

    def _take_next_local(self) -> int:
        self._next_local += 1
        return self._next_local - 1

    def _settle(self, index: int) -> None:
        local = index // self.world_size
        if local < self._watermark or local in self._settled_above:
            return
        self._settled_above.add(local)
        while self._watermark in self._settled_above:
            self._settled_above.remove(self._watermark)
            self._watermark += 1

    async def _take(self, selection: GroupSelection) -> None:
        """Collect complete, fresh groups into ``selection`` until it needs no more. The producer's demand is
        what the selection still misses: a group the filter rejects leaves it unchanged, so a new group (a new
        seed) replaces it, until the selection's bound on extra groups is reached."""
        self._ensure_producer()
        demanded = selection.missing
        self._demand += demanded
        self._kick.set()
        try:
            while selection.missing:
                for group in await self.queue.take(1):
                    if self.engine.policy_version - group.policy_version > self.config.max_staleness:
                        self.queue.counters["dropped_stale"] += 1
                        self._settle(group.index)
                    else:
                        selection.offer(group)
                self._demand -= demanded - selection.missing
                demanded = selection.missing
                self._kick.set()
        finally:
            self._demand -= demanded

    def _ensure_producer(self) -> None:
        if self._producer is None or self._producer.done():
            self._producer = asyncio.create_task(self._produce(), name="rollout-producer")
            self._producer.add_done_callback(self._producer_died)

    def _producer_died(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.queue.fail(task.exception())

    async def _produce(self) -> None:
        members = self.config.group_size + self.config.group_redundancy
        while True:
            await self._kick.wait()
            self._kick.clear()
            wanted = self._demand + self.config.max_staleness * self.config.groups_per_batch
            while (
                self._generation_open.is_set()
                and len(self.queue.live) < wanted
                and (not self._episodes or len(self._episodes) + members <= self.config.concurrent_episodes)
            ):
                group = self.new_group()
                for member in range(members):
                    task = asyncio.create_task(self._play(group, member), name=f"episode-{group.index}-{member}")
                    self._episodes.add(task)
                    task.add_done_callback(self._episode_done)
                    group.tasks.append(task)

    def _episode_done(self, task: asyncio.Task[None]) -> None:
        """Give the slot back and wake the producer: runs however the task ended, even cancelled before it ran."""
        self._episodes.discard(task)
        self._kick.set()

    async def _play(self, group: Group, member: int) -> None:
        try:
            episode = await self.play_member(group, member)
            if episode is not None and self.queue.put(group.index, episode):
                self.counters["groups_failed_in_a_row"] = 0
                for task in group.tasks:
                    if task is not asyncio.current_task() and not task.done():
                        task.cancel()
                        self.counters["redundant_cancelled"] += 1
        except asyncio.CancelledError:
            pass
        except (ContextBudgetError, EngineClosed, RolloutConfigError, EnvOutage) as err:
            self.queue.fail(err)
        except Exception as err:  # a bug must stop the run loudly, not leave get_batch waiting
            log.exception("episode task crashed")
            self.queue.fail(err)

    async def play_member(self, group: Group, member: int) -> Episode | None:
        """Play one member to the end, with retries; None if its group was dropped meanwhile or now."""
        attempts = failures = 0
        while True:
            attempts += 1
            episode = Episode(group.index, member, group.seed, self.config.env_id, layout=self.config.episode.layout)
            episode.attempts = attempts
            session: EnvSession | None = None
            try:
                session = await self._session()
                builder = EpisodeBuilder(self.tokenizer, self.config.episode, session.spec, episode, self.stop_ids)
                async with asyncio.timeout(self.config.episode_timeout_s):  # no extra task, unlike wait_for
                    result = await run_episode(session, self, builder, turn_timeout_s=self.config.turn_timeout_s)
            except EnvOutage:
                self._discard(session)
                raise
            except RETRYABLE as err:
                if session is None and isinstance(err, EpisodeFailed) and err.code in REFUSED_CONFIG:
                    raise RolloutConfigError(
                        f"the env servers refused rollout.env_id={self.config.env_id!r} with rollout.env_config="
                        f"{self.config.env_config}: {err.detail}"
                    ) from err
                self._discard(session)
                failures += 1
                if group.finished:
                    return None
                if self.note_failure(err):
                    attempts -= 1  # the outage's fault, not the episode's: the replay waits for an endpoint
                elif attempts > self.config.episode_retries:
                    log.warning("group %d dropped: member %d failed %d times: %s", group.index, member, attempts, err)
                    dropped = self.queue.drop(group.index, "failed")
                    if dropped is not None:
                        self._abandon(dropped)
                        self._count_failed_group()
                    return None
                else:
                    self.counters["episode_retries"] += 1
                await asyncio.sleep(self._backoff_s(failures))
                continue
            except BaseException:
                self._discard(session)
                raise
            finally:
                release = getattr(self.engine, "release", None)
                if release is not None:
                    release(episode.traj_key)
            self._idle_sessions.append(session)
            self.counters["episodes"] += 1
            return result

    def note_failure(self, err: BaseException) -> bool:
        """Record a failed episode; True when every env endpoint is down (an outage, not the episode's fault)."""
        self._last_failure = err
        if isinstance(err, EpisodeFailed) and err.infrastructure and self.pool.in_outage:
            self.counters["outage_waits"] += 1
            return True
        return False

    def _backoff_s(self, failures: int) -> float:
        """Wait before replay ``failures``: ``retry_backoff_s`` doubling per failure, at most 30 s, with jitter."""
        base = min(30.0, self.config.retry_backoff_s * 2 ** (failures - 1))
        return base * (0.5 + 0.5 * self._jitter.random())

    def _count_failed_group(self) -> None:
        self.counters["groups_failed_in_a_row"] += 1
        if self.counters["groups_failed_in_a_row"] >= self.config.max_failed_groups_in_a_row:
            self.queue.fail(
                EpisodesKeepFailing(
                    f"{int(self.counters['groups_failed_in_a_row'])} groups in a row were dropped because their "
                    f"episodes kept failing; last error: {self._last_failure!r}"
                )
            )

    def _abandon(self, group: Group) -> None:
        self._settle(group.index)
        for task in group.tasks:
            if task is not asyncio.current_task() and not task.done():
                task.cancel()

    async def _session(self) -> EnvSession:
        if self._idle_sessions:
            return self._idle_sessions.pop()
        return await self.pool.open(self.config.env_id, self.config.env_config, tag=f"rank{self.rank}")

    def _discard(self, session: EnvSession | None) -> None:
        if session is None:
            return
        task = asyncio.create_task(session.close())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
