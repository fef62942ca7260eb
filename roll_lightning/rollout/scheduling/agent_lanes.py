"""The run's agent lanes (``agent:`` entries of ``data.rollout.envs``), each with its own `AgentEndpoint`."""

from __future__ import annotations

import asyncio
from typing import Any

from roll_lightning.rollout.agents.runner import run_agent_episode
from roll_lightning.rollout.config.envs import LaneSpec
from roll_lightning.rollout.engines.base import Generates
from roll_lightning.rollout.episodes.episode import Episode


class AgentLanes:
    """Starts each lane's endpoint on first use (``engine``: the scheduler's gate) and plays its episodes."""

    def __init__(self, engine: Generates, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer
        self.endpoints: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def play(self, lane: LaneSpec, episode: Episode) -> Episode:
        assert lane.agent is not None
        return await run_agent_episode(await self._endpoint(lane), lane.agent, episode)

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

    async def close(self) -> None:
        await asyncio.gather(*(e.stop() for e in self.endpoints.values()), return_exceptions=True)
        self.endpoints.clear()
