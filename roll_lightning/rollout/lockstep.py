"""Lock-step collection: every episode of a batch takes turn k before any takes turn k+1.

This is the classic collector (verl-agent's loop, the seed's `lockstep` baseline): reset all, then repeatedly
generate for all live episodes together and step all envs together, so generation waits for the slowest env
and envs wait for the longest reply. It exists for debugging (a turn is a clean barrier) and as the
benchmark baseline. A group with a failed member is dropped and replaced in the next round (no replays); while
every env endpoint is down such drops do not count towards the failed-groups limit, and the next round's
sessions wait for an endpoint (`EnvPool.open`), whose `EnvOutage` ends the run. Replies go through the
scheduler's suspend/resume gate, so ``on_suspend`` applies as in async mode: with ``abort`` a reply cancelled by a
suspend is asked again after the resume and the round's env steps wait for it (every env steps once per turn).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from roll_lightning.envs import EnvOutage
from roll_lightning.rollout.episode import EpisodeBuilder
from roll_lightning.rollout.filters import GroupSelection
from roll_lightning.rollout.groups import Group
from roll_lightning.rollout.scheduler import RETRYABLE

if TYPE_CHECKING:
    from roll_lightning.rollout.scheduler import RolloutScheduler


async def collect_lockstep(scheduler: RolloutScheduler, selections: list[GroupSelection]) -> None:
    """Play rounds of as many groups as each env's selection still misses (failed or filtered groups are
    replaced in the next round) until none needs more; every env's groups play in the same round."""
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
    opened = await asyncio.gather(*(s._session(s.lanes[g.lane]) for g, _ in members), return_exceptions=True)
    failed: set[int] = set()
    builders: list[EpisodeBuilder | None] = []
    for (group, member), session in zip(members, opened, strict=True):
        if isinstance(session, EnvOutage):
            raise session
        if isinstance(session, BaseException):
            _fail(s, failed, group, session)
            builders.append(None)
            continue
        builders.append(s.builder(s.lanes[group.lane], session, s.new_episode(group, member)))
    sessions = [x if not isinstance(x, BaseException) else None for x in opened]

    def live() -> list[int]:
        return [i for i, b in enumerate(builders) if b is not None and members[i][0].index not in failed]

    started = time.perf_counter()
    resets = await asyncio.gather(
        *(sessions[i].reset(seed=members[i][0].seed) for i in live()),
        return_exceptions=True,  # type: ignore[union-attr]
    )
    for i, outcome in zip(live(), resets, strict=True):
        if isinstance(outcome, RETRYABLE):
            _fail(s, failed, members[i][0], outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            builders[i].start(outcome, time.perf_counter() - started)  # type: ignore[union-attr]
    while True:
        requests = {i: r for i in live() if (r := builders[i].next_request()) is not None}  # type: ignore[union-attr]
        if not requests:
            break
        t0 = time.perf_counter()
        replies = await asyncio.gather(
            *(
                asyncio.wait_for(s.generate(p, params, key=builders[i].episode.traj_key), cfg.turn_timeout_s)  # type: ignore[union-attr]
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
                actions[i] = builders[i].record_reply(reply, t1 - t0)  # type: ignore[union-attr]
        stepping = [i for i in actions if members[i][0].index not in failed]
        outcomes = await asyncio.gather(
            *(sessions[i].step(actions[i]) for i in stepping),
            return_exceptions=True,  # type: ignore[union-attr]
        )
        t2 = time.perf_counter()
        for i, outcome in zip(stepping, outcomes, strict=True):
            if isinstance(outcome, RETRYABLE):
                _fail(s, failed, members[i][0], outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                builders[i].record_step(outcome, t2 - t1)  # type: ignore[union-attr]
    wall = time.perf_counter() - started
    for i, (group, _member) in enumerate(members):
        session, builder = sessions[i], builders[i]
        if session is None or builder is None:
            continue
        if group.index in failed:
            s._discard(session)
            continue
        lane = s.lanes[group.lane]
        lane.idle_sessions.append(session)
        builder.episode.wall_s = wall
        s.counters["episodes"] += 1
        lane.queue.put(group.index, builder.episode)


def _fail(s: RolloutScheduler, failed: set[int], group: Group, err: BaseException) -> None:
    if group.index in failed:
        return
    failed.add(group.index)
    lane = s.lanes[group.lane]
    outage = s.note_failure(err, lane)
    if lane.queue.drop(group.index, "failed") is not None:
        s.settle(group)
        if not outage:
            s._count_failed_group()
