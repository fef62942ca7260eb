"""The agent side of a long-running agent (``agent.lifetime: run``, docs/agents.md): a loop that takes episodes
from the trainer and plays each with your coroutine, many at a time, reporting each reward or failure.

    from roll_lightning.agent_client import Handed, serve_episodes

    async def play(episode: Handed) -> float:
        client = openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)
        ...
        return reward  # or (reward, {"success": 1.0})

    serve_episodes(play)

The protocol underneath is three HTTP routes, for agents in any language: ``GET {ROLL_AGENT_URL}/next?wait=30``
(200 with an episode, 204 when none came, 410 when the run ends), then the episode's ``reward_url`` or
``failed_url``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

POLL_WAIT_S = 30  # how long each `GET /next` waits for an episode


@dataclass(frozen=True)
class Handed:
    """One episode as the trainer hands it over."""

    key: str
    base_url: str  # this episode's OpenAI base URL: every chat call of the episode goes here
    reward_url: str
    failed_url: str
    task: Mapping[str, Any]  # the seed, group and member, and the entry's ``agent.task``
    api_key: str  # the trainer's bearer token ("unused" on loopback)


Reward = float | tuple[float, Mapping[str, float]]


def serve_episodes(play: Callable[[Handed], Awaitable[Reward]], url: str | None = None) -> None:
    """Play every episode the trainer at ``url`` (default ``$ROLL_AGENT_URL``) hands over until the run ends."""
    asyncio.run(_serve(play, url or os.environ["ROLL_AGENT_URL"], os.environ.get("OPENAI_API_KEY", "unused")))


async def _serve(play: Callable[[Handed], Awaitable[Reward]], url: str, api_key: str) -> None:
    headers = {"authorization": f"Bearer {api_key}"}
    running: set[asyncio.Task] = set()
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=POLL_WAIT_S + 30)) as http:
        while True:
            answer = await http.get(f"{url}/next", params={"wait": POLL_WAIT_S})
            if answer.status_code == 410:  # the run is ending
                break
            if answer.status_code == 204:  # no episode came in time: ask again
                continue
            answer.raise_for_status()
            handed = Handed(**answer.json(), api_key=api_key)
            task = asyncio.create_task(_play_one(http, play, handed))
            running.add(task)
            task.add_done_callback(running.discard)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _play_one(http: httpx.AsyncClient, play: Callable[[Handed], Awaitable[Reward]], handed: Handed) -> None:
    """One episode: its reward reported, or, when ``play`` raises, the error (its traceback on stderr)."""
    try:
        result = await play(handed)
        reward, metrics = result if isinstance(result, tuple) else (result, {})
        report = (handed.reward_url, {"reward": reward, "metrics": dict(metrics)})
    except Exception as err:  # the episode fails; the agent plays on
        traceback.print_exc(file=sys.stderr)
        report = (handed.failed_url, {"error": f"{type(err).__name__}: {err}"})
    try:
        answer = await http.post(report[0], json=report[1])
        if answer.status_code != 200:  # e.g. 404: the trainer gave the episode up (agent.deadline_s)
            print(f"episode {handed.key}: the trainer answered {answer.status_code}: {answer.text}", file=sys.stderr)
    except httpx.HTTPError as err:
        print(f"episode {handed.key}: could not report it: {err!r}", file=sys.stderr)
