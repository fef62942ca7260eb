"""A long-running agent (``agent.lifetime: run``, issue 47): one process takes episodes from ``GET /agent/next``
and plays many at a time; each ends with its reward, or fails with the reason when the agent gives it up, goes
silent past the deadline or exits (its stderr's last lines quoted; the next episode starts it again). At the end
of the run its polls answer 410 and it exits, or is killed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.endpoints import serving

from roll_lightning.rollout.agents import service
from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig
from roll_lightning.rollout.agents.runner import AgentCommand, AgentFailed
from roll_lightning.rollout.agents.service import AgentService
from roll_lightning.rollout.episodes.episode import Episode

AGENT = str(Path(__file__).resolve().parent.parent / "support" / "agents" / "service_agent.py")


@pytest.fixture
async def endpoint(model_dir: Path, tokenizer: Any) -> AsyncIterator[AgentEndpoint]:
    async with serving(model_dir, tokenizer, EndpointConfig(max_context_tokens=1024, max_tokens=8)) as served:
        yield served


def agent(mode: str = "", deadline_s: float = 60.0) -> AgentCommand:
    return AgentCommand(("python", AGENT), env={"SERVICE_AGENT": mode}, lifetime="run", deadline_s=deadline_s)


async def test_one_program_plays_many_episodes_at_once(endpoint: AgentEndpoint) -> None:
    played, most = AgentService(endpoint, agent()), 0

    async def count_started_episodes() -> None:  # episodes with a call made and no reward yet, at once
        nonlocal most
        while True:
            most = max(most, sum(bool(e.calls) and not e.ended.is_set() for e in endpoint.episodes.values()))
            await asyncio.sleep(0.002)

    counting = asyncio.ensure_future(count_started_episodes())
    try:
        episodes = await asyncio.gather(*(played.play(Episode(k // 4, k % 4, 10 + k, "agent")) for k in range(8)))
        more = await played.play(Episode(2, 0, 20, "agent"))
    finally:
        counting.cancel()
        await played.stop()
    assert most > 1  # the episodes were played side by side, not one after another
    assert played.starts == 1 and played.process is not None and played.process.returncode == 0  # exited on 410
    for episode in [*episodes, more]:
        one, two = episode.turns
        assert two.prompt_ids[: len(one.prompt_ids) + len(one.response_ids)] == one.prompt_ids + one.response_ids
        assert episode.score == episode.seed % 3 and two.metrics == {"success": 1.0}
        assert one.observation == f"[user] Task {episode.seed}." and episode.end_reason == "terminated"
    assert endpoint.episodes == {}


async def test_an_episode_the_agent_gives_up_fails_and_the_agent_plays_on(endpoint: AgentEndpoint) -> None:
    played = AgentService(endpoint, agent("give_up_odd"))
    try:
        with pytest.raises(AgentFailed, match="it gave the episode up: ValueError: no answer for seed 11") as failed:
            await played.play(Episode(0, 0, 11, "agent"))
        assert failed.value.reason == "crashed"
        assert (await played.play(Episode(0, 1, 12, "agent"))).score == 0.0  # 12 % 3, the same program
    finally:
        await played.stop()
    assert played.starts == 1


async def test_a_silent_episode_is_given_up_at_the_deadline(endpoint: AgentEndpoint) -> None:
    played = AgentService(endpoint, agent("silent_odd", deadline_s=1.0))
    try:
        with pytest.raises(AgentFailed, match=r"no reward after 1.0 s \(agent.deadline_s\): given up") as failed:
            await played.play(Episode(0, 0, 11, "agent"))
        assert failed.value.reason == "hung" and endpoint.episodes == {}
        played.agent = replace(played.agent, deadline_s=60.0)  # the next episode's first calls import openai's parts
        assert (await played.play(Episode(0, 1, 12, "agent"))).score == 0.0 and played.starts == 1
    finally:
        await played.stop()


async def test_an_exit_fails_the_episodes_it_held_and_the_next_episode_starts_it_again(
    endpoint: AgentEndpoint,
) -> None:
    played = AgentService(endpoint, agent("exit_at=2"))
    try:
        assert (await played.play(Episode(0, 0, 4, "agent"))).score == 1.0
        with pytest.raises(AgentFailed, match=r"exited \(status 7\) before the episode ended; its stderr ends: "
                           r"pid \d+ \| exiting on purpose") as failed:  # fmt: skip
            await played.play(Episode(0, 1, 5, "agent"))
        assert failed.value.reason == "crashed" and endpoint.episodes == {}
        assert (await played.play(Episode(0, 2, 6, "agent"))).score == 0.0 and played.starts == 2
    finally:
        await played.stop()


async def test_a_program_that_ignores_the_end_of_the_run_is_killed(
    endpoint: AgentEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "EXIT_GRACE_S", 0.5)
    played = AgentService(endpoint, agent("stay"))
    await played.play(Episode(0, 0, 3, "agent"))
    await played.stop()
    assert played.process is not None and played.process.returncode == -9


async def test_a_program_that_cannot_start_fails_its_episode_in_one_line(endpoint: AgentEndpoint) -> None:
    missing = AgentCommand(("no-such-agent-program",), lifetime="run")
    with pytest.raises(AgentFailed, match="could not start 'no-such-agent-program' in .*: No such file"):
        await AgentService(endpoint, missing).play(Episode(0, 0, 1, "agent"))
    assert endpoint.episodes == {}


async def test_the_handout_route_answers_each_case(model_dir: Path, tokenizer: Any) -> None:
    config = EndpointConfig(max_context_tokens=1024, max_tokens=8, token="secret")
    async with serving(model_dir, tokenizer, config) as served, httpx.AsyncClient() as http:
        url, auth = f"{served.agent_url()}/next", {"authorization": "Bearer secret"}
        assert (await http.get(url, params={"wait": 0}, headers=auth)).status_code == 204  # nothing offered
        assert (await http.get(url)).status_code == 401
        bad = await http.get(url, params={"wait": "soon"}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "wait"
        key = served.open()
        await served.handout.offer(key, {"seed": 5})
        handed = (await http.get(url, params={"wait": 1}, headers=auth)).json()
        assert handed == {**served.handed(key, {"seed": 5}), "key": key} and handed["base_url"] == served.url(key)
        waiting = asyncio.ensure_future(http.get(url, params={"wait": 30}, headers=auth))
        while served.handout.polls == 0:
            await asyncio.sleep(0.01)
        failed = await http.post(handed["failed_url"], json={"error": ""}, headers=auth)
        assert failed.status_code == 400 and failed.json()["error"]["param"] == "error"
        assert (await http.post(handed["failed_url"], json={"error": "no luck"}, headers=auth)).status_code == 200
        late = await http.post(handed["reward_url"], json={"reward": 1.0}, headers=auth)
        assert late.status_code == 409 and "cannot follow a `failed` report" in late.json()["error"]["message"]
        assert served.finish(key).error == "no luck"
        await served.handout.close()
        gone = await waiting
        assert gone.status_code == 410 and gone.json()["error"]["message"] == "the run is ending: no more episodes"
        assert (await http.get(url, params={"wait": 0}, headers=auth)).status_code == 410
