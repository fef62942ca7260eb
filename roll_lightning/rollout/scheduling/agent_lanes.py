"""The run's agent lanes (``agent:`` entries of ``data.rollout.envs``), each with its own `AgentEndpoint`."""

from __future__ import annotations

import asyncio
from typing import Any

from roll_lightning.rollout.agents.runner import run_agent_episode
from roll_lightning.rollout.config.envs import LaneSpec
from roll_lightning.rollout.engines.base import Generates
from roll_lightning.rollout.episodes.episode import Episode


class AgentLanes:
    """Starts each lane's endpoint on first use (``engine``: the scheduler's gate) and plays its episodes: with a
    run of the agent per episode, or through the lane's long-running agent (``lifetime: run``)."""

    def __init__(self, engine: Generates, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.endpoints: dict[str, Any] = {}
        self.services: dict[str, Any] = {}
        self.runs = 0  # agent programs started for one episode each (``lifetime: episode``)
        self._lock = asyncio.Lock()

    async def play(self, lane: LaneSpec, episode: Episode) -> Episode:
        assert lane.agent is not None
        endpoint = await self._endpoint(lane)
        if lane.agent.lifetime == "episode":
            self.runs += 1
            return await run_agent_episode(endpoint, lane.agent, episode)
        if lane.tag not in self.services:
            from roll_lightning.rollout.agents.service import AgentService

            self.services[lane.tag] = AgentService(endpoint, lane.agent)
        return await self.services[lane.tag].play(episode)

    async def _endpoint(self, lane: LaneSpec) -> Any:
        from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig

        async with self._lock:
            if lane.tag not in self.endpoints:
                agent, settings = lane.agent, lane.episode
                assert agent is not None
                config = EndpointConfig(
                    host=agent.listen,
                    advertise=agent.advertise,
                    token=agent.token,
                    max_context_tokens=settings.max_context_tokens,
                    max_tokens=settings.sampling.max_new_tokens,
                    max_turns=settings.max_turns,
                    tool_parser=settings.prompt.tool_parser,
                    temperature=settings.sampling.temperature,
                )
                endpoint = AgentEndpoint(self.engine, self.tokenizer, config)
                await endpoint.start()
                self.endpoints[lane.tag] = endpoint
            return self.endpoints[lane.tag]

    def clamped(self) -> int:
        """Calls whose ``max_tokens`` was clamped to their lane's reply budget, since the start."""
        return sum(endpoint.clamped for endpoint in self.endpoints.values())

    def starts(self) -> int:
        """Agent programs started since the start: one per episode, or one per long-running agent (and restart)."""
        return self.runs + sum(s.starts for s in self.services.values())

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.services.values()), return_exceptions=True)
        await asyncio.gather(*(e.stop() for e in self.endpoints.values()), return_exceptions=True)
        self.services.clear()
        self.endpoints.clear()
