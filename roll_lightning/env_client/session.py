"""`EnvSession`: one env session on one endpoint, as the rollout sees it.

It keeps the protocol bookkeeping (episode id, step index, request ids) out of the caller's way and refuses
answers that break env.proto's rules on echoes, images and tool results (`ProtocolViolation`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format

from roll_lightning.env_client.errors import EchoMismatch, EpisodeFailed, ProtocolViolation
from roll_lightning.env_client.tools import (
    ClientTool,
    ClientToolCall,
    ClientToolResult,
    check_results,
    fill_calls,
    results_of,
    tools_in,
    tools_of,
)
from roll_lightning.protocol.v1 import env_pb2 as pb

if TYPE_CHECKING:
    from roll_lightning.env_client.pool import Endpoint, EnvPool


IMAGE_MARKER = "<image>"  # where an image stands in an observation's text


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class ObservationImage:
    """Encoded bytes and their media type ("image/png" or "image/jpeg")."""

    data: bytes
    media_type: str


@dataclass(frozen=True)
class ResetOutcome:
    episode_id: str
    seed: int
    observation: str
    info: dict[str, Any] = field(default_factory=dict)
    images: tuple[ObservationImage, ...] = ()  # one per IMAGE_MARKER in `observation`, in order


@dataclass(frozen=True)
class StepOutcome:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    action_valid: bool
    metrics: dict[str, float] = field(default_factory=dict)
    env_seconds: float = 0.0
    raw_info: Any = field(default=None, repr=False)  # protobuf Struct, converted lazily by `info`
    images: tuple[ObservationImage, ...] = ()
    tool_results: tuple[ClientToolResult, ...] = ()  # one per tool call, in call order

    @functools.cached_property
    def info(self) -> dict[str, Any]:
        """The env's info dict (numbers arrive as floats)."""
        return json_format.MessageToDict(self.raw_info) if self.raw_info is not None else {}

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class EnvSession:
    """Created by `EnvPool.open`; not thread-safe (one episode runner drives one session)."""

    def __init__(self, pool: EnvPool, endpoint: Endpoint, session_id: str, spec: pb.EnvSpec) -> None:
        self.pool = pool
        self.endpoint = endpoint
        self.session_id = session_id
        self.spec = spec
        self.episode_id = ""
        self.step_index = 0
        self.closed = False
        self.gate: asyncio.Semaphore | None = None  # held while open: the env's max_sessions (`EnvPool.open`)
        pool.open_sessions.add(self)  # `EnvPool.close` closes what is still open
        # unique per session is enough (the server keys replay by session); cheaper than a uuid
        self._request_ids = map(str, itertools.count(1))

    @property
    def address(self) -> str:
        return self.endpoint.address

    async def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> ResetOutcome:
        """Start a new episode; ``seed=None`` lets the server draw one (returned in the outcome)."""
        self._check_open()
        request = pb.ResetRequest(session_id=self.session_id, request_id=next(self._request_ids))
        if seed is not None:
            request.seed = seed
        if options:
            request.options.update(options)
        result = await self.pool.call(self.endpoint, "reset", request, self.pool.reset_timeout_s)
        self._check_echo("session_id", self.session_id, result.session_id)
        if seed is not None:
            self._check_echo("seed", seed, result.seed)
        if not result.episode_id or result.episode_id == self.episode_id:
            raise EchoMismatch(
                "episode_id", "a new episode id", result.episode_id, endpoint=self.address, session_id=self.session_id
            )
        images = self._images(result)
        self.episode_id, self.step_index = result.episode_id, 0
        return ResetOutcome(result.episode_id, result.seed, result.observation, _to_dict(result, "info"), images)

    @functools.cached_property
    def tools(self) -> tuple[ClientTool, ...]:
        """The env's tools (empty for a text env)."""
        try:
            return tools_in(self.spec)
        except ValueError as exc:
            raise ProtocolViolation(str(exc), endpoint=self.address, session_id=self.session_id) from None

    async def step(self, action: str, tool_calls: Sequence[ClientToolCall] = ()) -> StepOutcome:
        """Send the agent's reply (text and parsed tool calls) as the episode's next action."""
        self._check_open()
        if not self.episode_id:
            raise EpisodeFailed(
                grpc.StatusCode.FAILED_PRECONDITION,
                "step() before reset()",
                endpoint=self.address,
                session_id=self.session_id,
            )
        request = pb.StepRequest(
            session_id=self.session_id,
            episode_id=self.episode_id,
            step_index=self.step_index,
            request_id=next(self._request_ids),
        )
        request.action.text = action  # cheaper than copying in an Action message
        if tool_calls:
            fill_calls(request.action, tool_calls)
        result = await self.pool.call(self.endpoint, "step", request, self.pool.call_timeout_s)
        self._check_echo("session_id", self.session_id, result.session_id)
        self._check_echo("episode_id", self.episode_id, result.episode_id)
        self._check_echo("step_index", self.step_index, result.step_index)
        images = self._images(result)
        tool_results = self._tool_results(tool_calls, result) if tool_calls or result.tool_results else ()
        self.step_index += 1
        return StepOutcome(
            observation=result.observation,
            reward=result.reward,
            terminated=result.terminated,
            truncated=result.truncated,
            action_valid=result.action_valid,
            metrics=dict(result.metrics),
            env_seconds=result.env_seconds,
            raw_info=result.info if result.HasField("info") else None,
            images=images,
            tool_results=tool_results,
        )

    def unforkable(self) -> str:
        """Why `fork` would be refused before any call ("" when it would not)."""
        if "fork" not in self.endpoint.capabilities:
            return f"env '{self.spec.env_id}' cannot be forked: the server does not advertise \"fork\""
        if not self.spec.forkable:
            return f"env '{self.spec.env_id}' cannot be forked: its spec says forkable: false"
        return ""

    async def fork(self, copies: int) -> list[EnvSession]:
        """``copies`` new sessions that continue this episode from here, each exactly as this one would (env.proto,
        "Fork"; the server must advertise "fork" and the env be ``spec.forkable``). Each is closed on its own."""
        self._check_open()
        if not self.episode_id:
            raise EpisodeFailed(
                grpc.StatusCode.FAILED_PRECONDITION, "fork() before reset()", endpoint=self.address,
                session_id=self.session_id,
            )  # fmt: skip
        why = self.unforkable()
        if why:
            raise EpisodeFailed(
                grpc.StatusCode.FAILED_PRECONDITION, why, endpoint=self.address, session_id=self.session_id
            )
        gates = [self.gate] * copies if self.gate is not None else []
        for gate in gates:  # copies hold the env's session slots too
            await gate.acquire()
        request = pb.ForkSessionRequest(session_id=self.session_id, copies=copies, request_id=new_request_id())
        try:
            answer = await self.pool.fork(self.endpoint, request)
        except BaseException:
            for gate in gates:
                gate.release()
            raise
        if len(answer.forks) != copies or answer.step_index != self.step_index:
            raise ProtocolViolation(
                f"ForkSession(copies={copies}) at step {self.step_index} answered {len(answer.forks)} copies at "
                f"step {answer.step_index}",
                endpoint=self.address, session_id=self.session_id,
            )  # fmt: skip
        forks = []
        for made in answer.forks:
            twin = EnvSession(self.pool, self.endpoint, made.session_id, self.spec)
            twin.episode_id, twin.step_index, twin.gate = made.episode_id, self.step_index, self.gate
            forks.append(twin)
        return forks

    async def close(self) -> None:
        """Close the server-side session, best effort (the server reaps it after its TTL)."""
        if self.closed:
            return
        self.closed = True
        self.pool.open_sessions.discard(self)
        self.endpoint.active = max(0, self.endpoint.active - 1)
        try:
            if not self.endpoint.ejected:
                await self.endpoint.client.close_session(self.session_id, timeout=self.pool.health_timeout_s * 2)
        except EpisodeFailed:
            pass
        finally:  # after the server closed its session: the next one may take the env's slot
            if self.gate is not None:
                self.gate.release()

    def _check_echo(self, field: str, expected: object, got: object) -> None:
        if got != expected:
            raise EchoMismatch(field, expected, got, endpoint=self.address, session_id=self.session_id)

    def _images(self, result: pb.ResetResult | pb.StepResult) -> tuple[ObservationImage, ...]:
        """The answer's images, after checking one "<image>" marker per image."""
        images = result.images
        if not images and IMAGE_MARKER not in result.observation:
            return ()
        markers = result.observation.count(IMAGE_MARKER)
        if markers != len(images):
            raise ProtocolViolation(
                f"the observation holds {markers} {IMAGE_MARKER} markers but the answer carries {len(images)} "
                "images (env.proto: one marker per image, in order)",
                endpoint=self.address,
                session_id=self.session_id,
            )
        return tuple(ObservationImage(image.data, image.media_type) for image in images)

    def _tool_results(self, calls: Sequence[ClientToolCall], result: pb.StepResult) -> tuple[ClientToolResult, ...]:
        broken = check_results(calls, result.tool_results)
        if broken:
            raise ProtocolViolation(
                f"{broken} (env.proto: one result per call, with its id, in call order)",
                endpoint=self.address,
                session_id=self.session_id,
            )
        return results_of(result.tool_results)

    def _check_open(self) -> None:
        if self.closed:
            raise EpisodeFailed(
                grpc.StatusCode.FAILED_PRECONDITION,
                "session is closed",
                endpoint=self.address,
                session_id=self.session_id,
            )


def _to_dict(message: Any, name: str) -> dict[str, Any]:
    return json_format.MessageToDict(getattr(message, name)) if message.HasField(name) else {}


__all__ = [
    "IMAGE_MARKER",
    "ClientTool",
    "ClientToolCall",
    "ClientToolResult",
    "EnvSession",
    "ObservationImage",
    "ResetOutcome",
    "StepOutcome",
    "new_request_id",
    "tools_of",
]
