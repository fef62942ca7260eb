"""A long-running agent program (``agent.lifetime: run``): started once, it takes episodes from the endpoint
(``GET {ROLL_AGENT_URL}/next``) and plays many at a time, so no interpreter starts per episode (docs/agents.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

from roll_lightning.rollout.agents.runner import (
    AgentCommand,
    AgentFailed,
    filled,
    kill_group,
    start_agent,
    stderr_tail,
    task_of,
)
from roll_lightning.rollout.episodes.episode import Episode

if TYPE_CHECKING:
    from roll_lightning.rollout.agents.endpoint import AgentEndpoint

EXIT_GRACE_S = 5.0  # how long the program may take to exit once its polls answer 410, before it is killed


class AgentService:
    """One lane's agent program: started at the lane's first episode and again after it exits. Each episode is
    offered to it and ends when it reports the reward (or ``failed``); an exit fails the episodes it held."""

    def __init__(self, endpoint: AgentEndpoint, agent: AgentCommand) -> None:
        self.endpoint, self.agent = endpoint, agent
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0  # times the program was started
        self._stderr: deque[bytes] = deque(maxlen=4)  # its last chunks (4 KiB each), for `stderr_tail`
        self._exited: asyncio.Task[int] | None = None  # the running program's exit status, when it exits
        self._lock = asyncio.Lock()

    async def play(self, episode: Episode) -> Episode:
        exited = await self._running()
        key = self.endpoint.open()
        record = self.endpoint.episodes[key]
        ended = asyncio.ensure_future(record.ended.wait())
        try:
            await self.endpoint.handout.offer(key, task_of(self.agent, episode))
            async with asyncio.timeout(self.agent.deadline_s):
                await asyncio.wait({ended, exited}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise AgentFailed(
                "hung", f"the episode had no reward after {self.agent.deadline_s} s (agent.deadline_s): given up"
            ) from None
        finally:
            ended.cancel()
            record = self.endpoint.finish(key)  # later calls for it get 404
        if not record.ended.is_set():
            raise AgentFailed(
                "crashed", f"the agent program exited (status {exited.result()}) before the episode ended; its "
                f"stderr ends: {stderr_tail(b''.join(self._stderr))}"
            )  # fmt: skip
        if record.error is not None:
            raise AgentFailed("crashed", f"it gave the episode up: {record.error}")
        return filled(episode, record)

    async def _running(self) -> asyncio.Task[int]:
        """The program's exit as a task, starting the program when it is not running."""
        async with self._lock:
            if self._exited is None or self._exited.done():
                env = {
                    "OPENAI_API_KEY": self.endpoint.config.token or "unused",
                    "ROLL_AGENT_URL": self.endpoint.agent_url(),
                }
                self.process = await start_agent(self.agent, env)
                self.starts += 1
                self._stderr.clear()
                self._exited = asyncio.create_task(self._watch(self.process))
            return self._exited

    async def _watch(self, process: asyncio.subprocess.Process) -> int:
        """Keep the last lines of the program's stderr (never letting the pipe fill) until it exits."""
        assert process.stderr is not None
        while chunk := await process.stderr.read(4096):
            self._stderr.append(chunk)
        return await process.wait()

    async def stop(self) -> None:
        """End the program: its polls answer 410 (it should exit), then it is killed after `EXIT_GRACE_S`."""
        if self.process is None or self._exited is None:
            return
        await self.endpoint.handout.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(EXIT_GRACE_S):
                await asyncio.shield(self._exited)
        await kill_group(self.process)
        with contextlib.suppress(Exception):
            await self._exited
