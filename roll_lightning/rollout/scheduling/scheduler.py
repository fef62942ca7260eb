"""`RolloutScheduler`: keeps episodes running and hands out batches of complete groups, starting only what waiting
`get_batch` calls need plus ``max_staleness`` batches ahead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from roll_lightning.env_client import EnvOutage, EnvPool, EnvSession, EpisodeFailed
from roll_lightning.rollout.config.rollout import RolloutConfig, RolloutConfigError
from roll_lightning.rollout.engines.base import EngineClosed, Generation, GenerationEngine, SamplingParams
from roll_lightning.rollout.engines.router import EngineRouter
from roll_lightning.rollout.episodes.batch import RolloutBatch, collate
from roll_lightning.rollout.episodes.episode import (
    BeforeTurn,
    ContextBudgetError,
    Episode,
    EpisodeBuilder,
    run_episode,
)
from roll_lightning.rollout.groups.filters import GroupSelection, filter_metrics
from roll_lightning.rollout.groups.queue import Group, is_stale
from roll_lightning.rollout.prompts.vision import ImageEncoder, ImageInputError
from roll_lightning.rollout.scheduling.agent_lanes import AgentLanes
from roll_lightning.rollout.scheduling.branches import BranchPlan, BranchStart
from roll_lightning.rollout.scheduling.failures import REFUSED_CONFIG, REPLAYED_FAILURES, FailurePolicy
from roll_lightning.rollout.scheduling.gate import GenerationGate
from roll_lightning.rollout.scheduling.lanes import LaneState, lane_states
from roll_lightning.rollout.scheduling.ledger import GroupLedger, Split, group_seed
from roll_lightning.rollout.scheduling.metrics import batch_metrics

log = logging.getLogger(__name__)

__all__ = ["REPLAYED_FAILURES", "RolloutScheduler", "Split", "group_seed"]


class RolloutScheduler:
    def __init__(
        self,
        pool: EnvPool | Mapping[str, EnvPool],
        engine: GenerationEngine,
        tokenizer: Any,
        config: RolloutConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        stop_token_ids: Sequence[int] = (),
        split: Split = "train",
        vision: ImageEncoder | None = None,
    ) -> None:
        """Create on the loop that runs it; ``pool``: one for every env, or one per tag."""
        self.engine, self.tokenizer, self.config, self.vision = engine, tokenizer, config, vision
        self.rank, self.world_size, self.split = rank, world_size, split
        pools = pool if isinstance(pool, EnvPool) else dict(pool)
        self.lanes = lane_states(config.lanes, pools, config.max_staleness, config.staleness == "admit")
        self.stop_ids = {s for s in {tokenizer.eos_token_id, *stop_token_ids} if s is not None}
        self.filter = config.group_filter.build()
        self.counters: dict[str, float] = {
            "episodes": 0,
            "episode_retries": 0,
            "redundant_cancelled": 0,
            "groups_failed_in_a_row": 0,
            "outage_waits": 0,  # replays during an outage (no retry used)
            "turns_aborted": 0,  # replies a suspend cancelled (on_suspend: abort)
            "turns_kept": 0,  # replies a suspend stopped and the new weights continued (on_suspend: keep)
        }
        self.gate = GenerationGate(engine, config.on_suspend, self.counters)
        self.failures = FailurePolicy(config, self.counters, self.fail)
        self.ledger = GroupLedger(self.lanes, seed=config.seed, rank=rank, world_size=world_size, split=split)
        self._episodes: set[asyncio.Task[None]] = set()  # each holds a running slot until done
        self._next_lane = 0  # where the next round-robin round starts
        self._background: set[asyncio.Task[Any]] = set()
        self._kick = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self.agents = AgentLanes(self.gate, tokenizer)

    # -- public API ----------------------------------------------------------------------------------

    async def get_batch(self, n: int | None = None) -> RolloutBatch:
        """Wait for ``n`` trajectories of complete, fresh groups, each env's share in config order."""
        n = self.config.batch_size if n is None else n
        if n % self.config.group_size:
            raise ValueError(f"get_batch({n}): not a multiple of group_size={self.config.group_size}")
        needed = self._shares(n // self.config.group_size)
        started = time.perf_counter()
        before = self.engine.stats()
        selections = [GroupSelection(self.filter, k) for k in needed]
        if self.config.mode == "lockstep":
            from roll_lightning.rollout.scheduling.lockstep import collect_lockstep

            await collect_lockstep(self, selections)
        else:
            await _first_error([self._take(lane, sel) for lane, sel in zip(self.lanes, selections, strict=True)])
        groups, filtered = [], []
        for selection in selections:
            chosen, dropped = selection.choose()
            groups += chosen
            filtered += dropped
        for group in [*groups, *filtered]:  # filtered groups too: never replayed
            self.settle(group)
        episodes = [ep for g in groups for ep in sorted(g.episodes, key=lambda e: e.member)[: g.size]]
        batch = collate(episodes, self.config.episode.row_layout, _pad_id(self.tokenizer))
        batch.metrics = batch_metrics(
            episodes, self, wall_s=time.perf_counter() - started, engine_before=before, engine_after=self.engine.stats()
        )
        batch.metrics.update(filter_metrics(self.filter, groups, filtered, sum(needed)))
        batch.metrics["rollout/turns_redone"] = float(sum(t.redone > 0 for ep in episodes for t in ep.turns))
        batch.metrics["rollout/turns_aborted_total"] = float(self.counters["turns_aborted"])
        if self.config.on_suspend == "keep":
            batch.metrics["rollout/turns_kept_total"] = float(self.counters["turns_kept"])
            across = sum(bool(t.versions) for ep in episodes for t in ep.turns)  # replies several weights sampled
            batch.metrics["rollout/turns_across_versions"] = float(across)
        if self.config.branch.on:
            plans = [g.branches for g in groups]
            forks = sum(p.forks for p in plans)
            batch.metrics["rollout/branches_per_group"] = sum(p.copies for p in plans) / max(len(plans), 1)
            batch.metrics["rollout/env_steps_per_row"] = sum(len(ep.turns) for ep in episodes) / max(len(batch), 1)
            batch.metrics["env/fork_latency_s"] = sum(p.fork_s for p in plans) / forks if forks else 0.0
            batch.metrics["env/forks_refused"] = float(sum(p.refused for p in plans))
        if any(lane.spec.agent is not None for lane in self.lanes):
            batch.metrics["rollout/agent_max_tokens_clamped_total"] = float(self.agents.clamped())
            batch.metrics["rollout/agent_starts_total"] = float(self.agents.starts())
        self.ledger.batches += 1
        return batch

    @property
    def batches(self) -> int:
        return self.ledger.batches

    def _shares(self, n_groups: int) -> list[int]:
        """Groups per lane for a batch of ``n_groups``."""
        per_batch = self.config.groups_per_batch
        if n_groups == per_batch:
            return [state.spec.groups for state in self.lanes]
        if len(self.lanes) == 1:
            return [n_groups]
        if n_groups % per_batch:
            raise ValueError(f"get_batch: {n_groups} groups do not split into the envs' shares of {per_batch}")
        return [state.spec.groups * n_groups // per_batch for state in self.lanes]

    async def suspend(self) -> None:
        """Hold new replies before weights change or the engine sleeps (`GenerationGate.close`)."""
        await self.gate.close()

    async def resume(self) -> None:
        """Drop the groups now too stale, then let generation go on."""
        for lane in self.lanes:
            for group in lane.queue.expire(self.engine.policy_version):
                self._abandon(group)
        self.gate.open()
        self._kick.set()

    async def close(self) -> None:
        if self._producer is not None:
            self._producer.cancel()
        live = [g for lane in self.lanes for g in lane.queue.live.values()]
        for group in live:
            for task in group.tasks:
                task.cancel()
        tasks = [t for g in live for t in g.tasks] + list(self._background)
        await asyncio.gather(*tasks, return_exceptions=True)
        idle = [session for lane in self.lanes for session in lane.idle_sessions]
        await asyncio.gather(*(s.close() for s in idle), return_exceptions=True)
        for lane in self.lanes:
            lane.idle_sessions.clear()
        await self.agents.close()

    def state_dict(self) -> dict[str, Any]:
        return self.ledger.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state)

    @property
    def ready(self) -> int:
        return sum(lane.queue.ready for lane in self.lanes)

    def counter(self, name: str) -> float:
        """A `GroupQueue` counter summed over the envs."""
        return float(sum(lane.queue.counters[name] for lane in self.lanes))

    def fail(self, error: BaseException) -> None:
        """Make every waiting and later `get_batch` raise ``error``."""
        for lane in self.lanes:
            lane.queue.fail(error)

    @property
    def running(self) -> int:
        return len(self._episodes)

    # -- generation gate -----------------------------------------------------------------------------

    @property
    def generating(self) -> int:
        return self.gate.generating

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams, *, key: str = "") -> Generation:
        """The engine behind the gate (what episodes call)."""
        return await self.gate.generate(prompt_ids, params, key=key)

    # -- partial overlap -----------------------------------------------------------------------------

    async def shrink_sampler(
        self, devices: Sequence[str], free_memory: Callable[[str], int | None] | None = None
    ) -> dict[str, Any]:
        """Free ``devices`` for training while the other replicas generate (`EngineRouter.shrink`)."""
        return await self._router("shrink_sampler").shrink(devices, free_memory)

    async def expand_sampler(self, devices: Sequence[str], skip_load: bool = False) -> dict[str, Any]:
        """Give ``devices`` back to generation (`EngineRouter.expand`)."""
        moved = await self._router("expand_sampler").expand(devices, skip_load)
        self._kick.set()
        return moved

    def _router(self, what: str) -> EngineRouter:
        if not isinstance(self.engine, EngineRouter):
            raise TypeError(f"{what}: the engine is one {type(self.engine).__name__}, not replicas behind a router")
        return self.engine

    # -- groups --------------------------------------------------------------------------------------

    def new_group(self, lane: LaneState) -> Group:
        group = self.ledger.new_group(lane, self.config.group_size, self.engine.policy_version)
        if self.config.branch.on:
            group.branches = BranchPlan(self.config.branch, self.config.group_size)
        lane.queue.add(group)
        return group

    def settle(self, group: Group) -> None:
        self.ledger.settle(group)

    async def _take(self, lane: LaneState, selection: GroupSelection) -> None:
        """Collect fresh groups of ``lane`` until ``selection`` misses none (a rejected group is replaced)."""
        self._ensure_producer()
        demanded = selection.missing
        lane.demand += demanded
        self._kick.set()
        try:
            while selection.missing:
                for group in await lane.queue.take(1):
                    if is_stale(self.engine.policy_version, group.policy_version, self.config.max_staleness):
                        lane.queue.counters["dropped_stale"] += 1
                        self.settle(group)
                    else:
                        selection.offer(group)
                lane.demand -= demanded - selection.missing
                demanded = selection.missing
                self._kick.set()
        finally:
            lane.demand -= demanded

    def _ensure_producer(self) -> None:
        if self._producer is None or self._producer.done():
            self._producer = asyncio.create_task(self._produce(), name="rollout-producer")
            self._producer.add_done_callback(self._producer_died)

    def _producer_died(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())

    async def _produce(self) -> None:
        members = self.config.group_size + self.config.group_redundancy
        while True:
            await self._kick.wait()
            self._kick.clear()
            while self.gate.is_open:  # one new group per lane that misses some, round-robin
                order = self.lanes[self._next_lane :] + self.lanes[: self._next_lane]
                waiting = [lane for lane in order if len(lane.queue.live) < self._wanted(lane)]
                started = 0
                for lane in waiting:
                    if self._episodes and len(self._episodes) + members > self.config.concurrent_episodes:
                        break
                    self._start_group(lane, members)
                    self._next_lane = (lane.position + 1) % len(self.lanes)
                    started += 1
                if not started:
                    break

    def _wanted(self, lane: LaneState) -> int:
        """Groups ``lane`` should have running or complete: what waiting batches miss, plus the run-ahead."""
        return lane.demand + self.config.max_staleness * lane.spec.groups

    def _start_group(self, lane: LaneState, members: int) -> None:
        group = self.new_group(lane)
        for member in range(members):
            name = f"episode-{lane.tag}-{group.index}-{member}"
            task = asyncio.create_task(self._play(group, member), name=name)
            self._episodes.add(task)
            task.add_done_callback(self._episode_done)
            group.tasks.append(task)

    def _episode_done(self, task: asyncio.Task[None]) -> None:
        """Free the slot and wake the producer, however the task ended."""
        self._episodes.discard(task)
        self._kick.set()

    async def _play(self, group: Group, member: int) -> None:
        try:
            episode = await self.play_member(group, member)
            if episode is not None and self.lanes[group.lane].queue.put(group.index, episode):
                self.failures.group_completed()
                for task in group.tasks:
                    if task is not asyncio.current_task() and not task.done():
                        task.cancel()
                        self.counters["redundant_cancelled"] += 1
        except asyncio.CancelledError:
            pass
        except (ContextBudgetError, ImageInputError, EngineClosed, RolloutConfigError, EnvOutage) as err:
            self.fail(err)
        except Exception as err:  # a bug must stop the run loudly, not leave get_batch waiting
            log.exception("episode task crashed")
            self.fail(err)

    async def play_member(self, group: Group, member: int) -> Episode | None:
        """Play one member to the end, with retries; None if its group was dropped. Under ``data.rollout.branch``
        a spine forks as it plays, and another member first waits for a fork to continue."""
        plan: BranchPlan | None = group.branches
        if plan is None:
            return await self._play_attempts(group, member)
        if plan.is_spine(member):
            try:
                return await self._play_attempts(group, member, before_turn=plan.fork_spine)
            finally:
                plan.spine_ended()
        return await self._play_attempts(group, member, start=await plan.start_of(member))

    async def _play_attempts(
        self, group: Group, member: int, *, start: BranchStart | None = None, before_turn: BeforeTurn | None = None
    ) -> Episode | None:
        """`play_member`'s loop: the first attempt of a forked member continues its fork (``start``); a replay
        plays from the reset."""
        lane = self.lanes[group.lane]
        attempts = failures = 0
        while True:
            attempts += 1
            forked = start is not None  # this attempt continues a fork, on a session made for it
            episode = start.builder.episode if start is not None else self.new_episode(group, member)
            episode.attempts = attempts
            session: EnvSession | None = None
            try:
                if lane.spec.agent is not None:
                    async with asyncio.timeout(self.config.episode_timeout_s):
                        result = await self.agents.play(lane.spec, episode)
                else:
                    if start is not None:
                        session, builder, start = start.session, start.builder, None
                    else:
                        session = await self.open_session(lane)
                        builder = self.builder(lane, session, episode)
                    async with asyncio.timeout(self.config.episode_timeout_s):  # no extra task, unlike wait_for
                        timeout = self.config.turn_timeout_s
                        result = await run_episode(
                            session, self.gate, builder, turn_timeout_s=timeout, before_turn=before_turn
                        )
            except EnvOutage:
                self.discard_session(session)
                raise
            except REPLAYED_FAILURES as err:
                if session is None and isinstance(err, EpisodeFailed) and err.code in REFUSED_CONFIG:
                    raise RolloutConfigError(
                        f"the env servers refused {lane.spec.key}.env_id={lane.spec.env_id!r} with "
                        f"{lane.spec.key}.env_config={lane.spec.env_config}: {err.detail}"
                    ) from err
                self.discard_session(session)
                failures += 1
                if group.finished:
                    return None
                if self.failures.note(err, lane) or (isinstance(err, EpisodeFailed) and err.draining):
                    attempts -= 1  # an outage's or a drain's fault: no retry used
                elif attempts > self.config.episode_retries:
                    log.warning("group %d dropped: member %d failed %d times: %s", group.index, member, attempts, err)
                    dropped = lane.queue.drop(group.index, "failed")
                    if dropped is not None:
                        self._abandon(dropped)
                        self.failures.group_dropped()
                    return None
                else:
                    self.counters["episode_retries"] += 1
                await asyncio.sleep(self.failures.backoff_s(failures))
                continue
            except BaseException:
                self.discard_session(session)
                raise
            finally:
                if isinstance(self.engine, EngineRouter):
                    self.engine.release(episode.traj_key)  # frees its replica slot in the router's balance
            if forked:  # closed, not kept: idle sessions stay as many as episodes that ran at once
                self.discard_session(session)
            else:
                self.keep_session(lane, session)
            self.counters["episodes"] += 1
            return result

    def new_episode(self, group: Group, member: int) -> Episode:
        lane = self.lanes[group.lane].spec
        return Episode(group.index, member, group.seed, lane.env_id, tag=lane.tag)

    def builder(self, lane: LaneState, session: EnvSession, episode: Episode) -> EpisodeBuilder:
        """The episode's bookkeeping, with its env's settings."""
        settings = lane.spec.episode
        stops = self.stop_ids | set(settings.sampling.stop_token_ids)
        return EpisodeBuilder(self.tokenizer, settings, session.spec, episode, stops, self.vision)

    def _abandon(self, group: Group) -> None:
        self.settle(group)
        for task in group.tasks:
            if task is not asyncio.current_task() and not task.done():
                task.cancel()

    async def open_session(self, lane: LaneState) -> EnvSession:
        """An idle session of ``lane`` whose server still takes episodes, or a new one."""
        while lane.idle_sessions:
            session = lane.idle_sessions.pop()
            if session.endpoint.accepting and not session.endpoint.ejected:
                return session
            self.discard_session(session)  # its server is draining or down
        return await lane.pool.open(lane.spec.env_id, lane.spec.env_config, tag=f"rank{self.rank}")

    def keep_session(self, lane: LaneState, session: EnvSession | None) -> None:
        """After an episode: ``session`` waits for the lane's next one, unless its env limits sessions at once
        (its slot goes to the episode waiting for it)."""
        if session is not None and session.gate is None:
            lane.idle_sessions.append(session)
        else:
            self.discard_session(session)

    def discard_session(self, session: EnvSession | None) -> None:
        """Close ``session`` in the background."""
        if session is None:
            return
        task = asyncio.create_task(session.close())
        self._background.add(task)
        task.add_done_callback(self._background.discard)


async def _first_error(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``coros`` together; the first error cancels the others and is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
