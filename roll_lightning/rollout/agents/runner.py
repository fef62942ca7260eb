"""One episode played by the user's agent program (docs/agents.md), its calls made into step rows; a failed agent
raises `AgentFailed`, never a silent zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from roll_lightning.env_client.errors import EpisodesKeepFailing
from roll_lightning.rollout.agents.record import AgentEpisode
from roll_lightning.rollout.episodes.episode import Episode, Turn

if TYPE_CHECKING:  # the endpoint imports starlette and uvicorn
    from roll_lightning.rollout.agents.endpoint import AgentEndpoint

STDERR_TAIL = 2000  # characters of a failed agent's stderr in its error ...
STDERR_LINES = 5  # ... its last lines, joined on one line
PYTHONS = ("python", "python3")  # a command starting with one of these runs the trainer's own interpreter
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # hosts an endpoint may listen on without a token


@dataclass(frozen=True)
class AgentCommand:
    """How each episode's agent starts.

    Args:
        command: the program and its arguments; a first word ``python`` or ``python3`` is the trainer's own
            interpreter (``sys.executable``, so the agent sees the packages installed with the trainer).
        cwd: its working folder (None: the trainer's).
        env: extra environment variables.
        deadline_s: seconds an episode may take: the agent is then killed (``lifetime: episode``) or the episode
            given up (``lifetime: run``).
        lifetime: ``episode`` starts the command for every episode; ``run`` starts it once, and it takes
            episodes from ``GET {ROLL_AGENT_URL}/next`` and plays many at a time (`service.AgentService`).
        task: extra ``ROLL_TASK`` fields.
        listen: the chat endpoint's host; not loopback needs ``token``.
        advertise: the host agents are given (None: ``listen``).
        token: the bearer token every call must carry.
    """

    command: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    deadline_s: float = 300.0
    lifetime: Literal["episode", "run"] = "episode"
    task: Mapping[str, Any] = field(default_factory=dict)
    listen: str = "127.0.0.1"
    advertise: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if not self.command or not all(isinstance(part, str) and part for part in self.command):
            raise ValueError(f"agent.command must be a non-empty list of strings, got {self.command!r}")
        if self.lifetime not in ("episode", "run"):
            raise ValueError(f"agent.lifetime must be episode or run, got {self.lifetime!r}")
        if self.deadline_s <= 0:
            raise ValueError(f"agent.deadline_s must be > 0, got {self.deadline_s}")
        if self.listen not in LOOPBACK and not self.token:
            raise ValueError(f"agent.listen={self.listen!r} is not loopback: set agent.token")

    def argv(self) -> tuple[str, ...]:
        """The command as started: ``python`` is `sys.executable`, not whichever ``python`` is first on PATH."""
        first, *rest = self.command
        return (sys.executable, *rest) if first in PYTHONS else self.command


class AgentFailed(RuntimeError):
    """The agent crashed, hung, made no call or reported no reward."""

    def __init__(self, reason: Literal["crashed", "hung", "no_calls", "no_reward"], detail: str) -> None:
        super().__init__(f"the agent {reason.replace('_', ' ')}: {detail}")
        self.reason, self.detail = reason, detail


class AgentsKeepFailing(EpisodesKeepFailing):
    """Groups kept being dropped because the agent program failed (not the envs): fix the agent, then resume."""


async def run_agent_episode(endpoint: AgentEndpoint, agent: AgentCommand, episode: Episode) -> Episode:
    """Play ``episode`` with one run of ``agent``: a turn per call."""
    key = endpoint.open()
    env = {
        "OPENAI_BASE_URL": endpoint.url(key),
        "OPENAI_API_KEY": endpoint.config.token or "unused",
        "ROLL_REWARD_URL": endpoint.reward_url(key),
        "ROLL_TASK": json.dumps(task_of(agent, episode)),
    }
    try:
        process = await start_agent(agent, env)
    except AgentFailed:
        endpoint.finish(key)
        raise
    try:
        async with asyncio.timeout(agent.deadline_s):
            _, stderr = await process.communicate()
    except TimeoutError:
        raise AgentFailed("hung", f"still running after {agent.deadline_s} s: killed") from None
    finally:
        await kill_group(process)  # hung or cancelled: with its children
        record = endpoint.finish(key)
    if process.returncode != 0:
        raise AgentFailed("crashed", f"exit status {process.returncode}; its stderr ends: {stderr_tail(stderr)}")
    return filled(episode, record)


async def start_agent(agent: AgentCommand, env: Mapping[str, str]) -> asyncio.subprocess.Process:
    """Start ``agent`` in a session of its own (so `kill_group` reaches its children), with the trainer's environment,
    the entry's ``env`` and ``env``; stderr is piped, for `stderr_tail`."""
    try:
        return await asyncio.create_subprocess_exec(
            *agent.argv(), cwd=agent.cwd, env={**os.environ, **agent.env, **env}, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
    except OSError as err:  # no such program or folder, not executable: the agent's failure, said in one line
        raise AgentFailed(
            "crashed", f"could not start {agent.argv()[0]!r} in {agent.cwd or os.getcwd()}: {err.strerror}"
        ) from err


def task_of(agent: AgentCommand, episode: Episode) -> dict[str, Any]:
    """What an episode's agent is told (``ROLL_TASK``): the entry's ``task``, the seed, group and member."""
    return {**agent.task, "seed": episode.seed, "group": episode.group_index, "member": episode.member}


async def kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill a still-running agent and every process it started (it runs in a session of its own)."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # it may have just exited
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


def stderr_tail(stderr: bytes) -> str:
    """The last lines of an agent's stderr on one line (`` | `` between them), so a run's last line shows them."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-STDERR_LINES:])[-STDERR_TAIL:] or "(empty)"


def prompt_state(prompt_ids: list[int]) -> str:
    """A call's GiGPO step state: its whole prompt, hashed."""
    return "prompt " + hashlib.blake2b(array("q", prompt_ids).tobytes(), digest_size=12).hexdigest()


def filled(episode: Episode, record: AgentEpisode) -> Episode:
    """The episode with a turn per call, the reward on the last."""
    if not record.calls:
        raise AgentFailed("no_calls", "it exited without calling the model")
    if record.reward is None:
        raise AgentFailed("no_reward", "it exited without reporting a reward")
    episode.turns = [
        Turn(
            prompt_ids=call.prompt_ids,
            response_ids=call.reply_ids,
            logprobs=call.logprobs,
            finish_reason=call.finish_reason,
            policy_version=call.policy_version,
            observation=call.shown,
            reply=call.reply,
            anchor=prompt_state(call.prompt_ids),
            versions=call.versions,
        )
        for call in record.calls
    ]
    episode.replies_judged, episode.refused_calls = False, record.refused
    last = episode.turns[-1]
    last.reward, last.metrics = record.reward, dict(record.metrics)
    episode.end_reason = "terminated"
    return episode
