"""Lock-step collection: every episode of a batch takes turn k before any takes turn k+1.

The classic collector (verl-agent's loop), for debugging (a turn is a clean barrier) and as the benchmark
baseline. A group with a failed member is dropped and replaced in the next round, not replayed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING

from roll_lightning.env_client import EnvOutage, EnvSession
from roll_lightning.rollout.episodes.episode import EpisodeBuilder
from roll_lightning.rollout.errors import RolloutConfigError
from roll_lightning.rollout.groups.filters import GroupSelection
from roll_lightning.rollout.groups.queue import Group
from roll_lightning.rollout.scheduling.failures import REPLAYED_FAILURES

if TYPE_CHECKING:
    from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler


async def collect_lockstep(scheduler: RolloutScheduler, selections: list[GroupSelection]) -> None:
    """Play rounds of the groups each env's selection still misses until none misses any."""
    while any(selection.missing for selection in selections):
        for lane in scheduler.lanes:
            if lane.queue.error is not None:
                raise lane.queue.error
        groups = [
            scheduler.new_group(lane)
            for lane, selection in zip(scheduler.lanes, selections, strict=True)
            for _ in range(selection.missing)
        ]
        await _play_round(scheduler, groups)
        for lane, selection in zip(scheduler.lanes, selections, strict=True):
            for group in await lane.queue.take(lane.queue.ready):
                selection.offer(group)


async def _play_round(s: RolloutScheduler, groups: list[Group]) -> None:
    cfg = s.config
    members = [(g, m) for g in groups for m in range(g.size)]
    for position, count in Counter(g.lane for g, _ in members).items():
        spec, pool = s.lanes[position].spec, s.lanes[position].pool
        limit = pool.session_limit(spec.env_id) if pool is not None else 0
        if limit and count > limit:
            raise RolloutConfigError(
                f"{spec.key}.env_id={spec.env_id!r} takes {limit} episode(s) at once (its spec's max_sessions) and "
                f"lock-step plays {count} at once: set data.rollout.mode async"
            )
    opened = await asyncio.gather(*(s.open_session(s.lanes[g.lane]) for g, _ in members), return_exceptions=True)
    failed: set[int] = set()
    playing: dict[int, tuple[EnvSession, EpisodeBuilder]] = {}  # member position -> its session and episode
    for i, ((group, member), session) in enumerate(zip(members, opened, strict=True)):
        if isinstance(session, EnvOutage):
            raise session
        if isinstance(session, BaseException):
            _fail(s, failed, group, session)
            continue
        playing[i] = (session, s.builder(s.lanes[group.lane], session, s.new_episode(group, member)))

    def live() -> list[int]:
        return [i for i in playing if members[i][0].index not in failed]

    started = time.perf_counter()
    resets = await asyncio.gather(
        *(playing[i][0].reset(seed=members[i][0].seed) for i in live()), return_exceptions=True
    )
    for i, outcome in zip(live(), resets, strict=True):
        if isinstance(outcome, REPLAYED_FAILURES):
            _fail(s, failed, members[i][0], outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            playing[i][1].start(outcome, time.perf_counter() - started)
    while True:
        requests = {i: r for i in live() if (r := playing[i][1].next_request()) is not None}
        if not requests:
            break
        t0 = time.perf_counter()
        replies = await asyncio.gather(
            *(
                asyncio.wait_for(s.generate(p, params, key=playing[i][1].episode.traj_key), cfg.turn_timeout_s)
                for i, (p, params) in requests.items()
            ),
            return_exceptions=True,
        )
        t1 = time.perf_counter()
        actions: dict[int, str] = {}
        for i, reply in zip(requests, replies, strict=True):
            if isinstance(reply, TimeoutError):
                _fail(s, failed, members[i][0], reply)
            elif isinstance(reply, BaseException):
                raise reply
            else:
                actions[i] = playing[i][1].record_reply(reply, t1 - t0)
        stepping = [i for i in actions if members[i][0].index not in failed]
        outcomes = await asyncio.gather(
            *(playing[i][0].step(actions[i], playing[i][1].calls) for i in stepping), return_exceptions=True
        )
        t2 = time.perf_counter()
        for i, outcome in zip(stepping, outcomes, strict=True):
            if isinstance(outcome, REPLAYED_FAILURES):
                _fail(s, failed, members[i][0], outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                playing[i][1].record_step(outcome, t2 - t1)
    wall = time.perf_counter() - started
    for i, (session, builder) in playing.items():
        group = members[i][0]
        if group.index in failed:
            s.discard_session(session)
            continue
        lane = s.lanes[group.lane]
        s.keep_session(lane, session)
        builder.episode.wall_s = wall
        s.counters["episodes"] += 1
        lane.queue.put(group.index, builder.episode)


def _fail(s: RolloutScheduler, failed: set[int], group: Group, err: BaseException) -> None:
    if group.index in failed:
        return
    failed.add(group.index)
    lane = s.lanes[group.lane]
    outage = s.failures.note(err, lane)
    if lane.queue.drop(group.index, "failed") is not None:
        s.settle(group)
        if not outage:
            s.failures.group_dropped()
