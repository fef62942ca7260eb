"""Sessions and the episode state machine (the rules of env.proto's header); `service.py` owns the transport.

Everything here is synchronous and may run on a worker thread; a per-session lock serialises calls to one
session, so racing retries see a consistent state.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
import numpy as np
from google.protobuf import json_format

from env_servers.api import (
    IMAGE_MARKER,
    Action,
    ConfigError,
    EnvSpec,
    Observation,
    TextEnv,
    config_schema,
    fork_env,
)
from env_servers.images import image_rule_broken
from env_servers.registry import EnvEntry, get_env
from env_servers.server.tools import (
    ToolBox,
    ToolRuleBroken,
    bad_call_penalty,
    check_calls,
    merge_results,
    tool_to_proto,
)
from roll_lightning.protocol.v1 import env_pb2 as pb


class ProtocolError(Exception):
    """A refused request: carries the gRPC status code and a message naming what is wrong."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> pb.Status:
        return pb.Status(code=self.code.value[0], message=self.message)


# UNAVAILABLE's message for new work while draining; the spec requires the "draining" prefix.
MAX_FORK_COPIES = 64  # the most copies one ForkSession makes (env.proto)
DRAINING = "draining: the server is shutting down; start new sessions and episodes on another server"


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def spec_to_proto(spec: EnvSpec, entry: EnvEntry, config: Any) -> pb.EnvSpec:
    msg = pb.EnvSpec(
        env_id=spec.env_id,
        version=spec.version,
        instruction=spec.instruction,
        action_format=spec.action_format,
        example_action=spec.example_action,
        max_steps=spec.max_steps,
        reward_min=spec.reward_min,
        reward_max=spec.reward_max,
        deterministic=spec.deterministic,
        splits=dict(spec.splits),
        config_schema=config_schema(entry.config_cls),
        metrics=list(spec.metrics),
        max_sessions=spec.max_sessions,
        forkable=entry.forkable,
    )
    if spec.tools:
        msg.tools.extend(tool_to_proto(tool) for tool in spec.tools)
    msg.config.update(_jsonable(config_as_dict(config)))
    return msg


def config_as_dict(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class Answered(NamedTuple):
    """The latest Reset or Step answer, replayed to a retry with its request_id."""

    request_id: str
    step_index: int  # a Reset's is 0
    result: Any


@dataclass(eq=False)
class Session:
    session_id: str
    entry: EnvEntry
    config: Any
    env: TextEnv
    spec: EnvSpec
    rng: np.random.Generator
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: int = 0  # calls in flight; a busy session is never reaped
    episode_id: str | None = None
    steps_taken: int = 0
    done: str = ""  # "", "terminated", "truncated" or "aborted"
    last_reset: Answered | None = None
    last_step: Answered | None = None
    last_fork: Answered | None = None
    toolbox: ToolBox | None = None  # the env's tools (None: a text env)

    @property
    def in_progress(self) -> bool:
        """An episode was reset and has not ended."""
        return self.episode_id is not None and not self.done

    def reset(self, req: pb.ResetRequest, *, draining: bool = False) -> pb.ResetResult:
        if not req.request_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        if self.last_reset and self.last_reset.request_id == req.request_id:
            if self.steps_taken == 0 and self.last_reset.result.episode_id == self.episode_id:
                return self.last_reset.result
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"request_id '{req.request_id}' is a stale Reset: episode {self.episode_id} has moved on",
            )
        if draining:
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE, DRAINING)
        seed = req.seed if req.HasField("seed") else int(self.rng.integers(0, 2**63))
        options = json_format.MessageToDict(req.options) if req.HasField("options") else None
        self.episode_id, self.steps_taken, self.done, self.last_step = None, 0, "", None
        try:
            obs, info = self.env.reset(seed, options)
            text, images = _observation(obs)
            # An unset status reads as OK: not building one saves a message per item.
            result = pb.ResetResult(session_id=self.session_id, seed=seed, observation=text)
            if images:
                result.images.extend(images)
            if info:
                result.info.update(_jsonable(info))
        except ProtocolError:
            raise
        except Exception as exc:
            raise ProtocolError(grpc.StatusCode.INTERNAL, _env_fault(self.spec.env_id, "reset", exc)) from exc
        self.episode_id = result.episode_id = _new_id("ep")
        self.last_reset = Answered(req.request_id, 0, result)
        return result

    def step(self, req: pb.StepRequest, max_action_bytes: int) -> pb.StepResult:
        if not req.request_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        if not req.episode_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "episode_id is required")
        text = req.action.text
        # A UTF-8 character is at most 4 bytes: short texts fit without encoding.
        size = len(text) if 4 * len(text) <= max_action_bytes else len(text.encode("utf-8"))
        if size > max_action_bytes:
            raise ProtocolError(
                grpc.StatusCode.INVALID_ARGUMENT, f"action.text is {size} bytes; this server accepts {max_action_bytes}"
            )
        last = self.last_step
        if last and last.request_id == req.request_id and req.episode_id == self.episode_id:
            if last.step_index == req.step_index:
                return last.result
        if self.episode_id is None:
            raise ProtocolError(grpc.StatusCode.FAILED_PRECONDITION, "no episode in progress: call Reset first")
        if req.episode_id != self.episode_id:
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"episode_id '{req.episode_id}' is not the current episode '{self.episode_id}'",
            )
        if self.done:
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"episode {self.episode_id} is over ({self.done} after {self.steps_taken} steps): call Reset",
            )
        if req.step_index != self.steps_taken:
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"step_index={req.step_index} but the next step of episode {self.episode_id} is {self.steps_taken}",
            )
        start = time.perf_counter()
        calls = req.action.tool_calls
        try:
            if self.toolbox is None and not calls:  # the hot path
                obs, reward, terminated, truncated, info = self.env.step(text)
                results = bad = None
            else:
                good, errors = check_calls(calls, self.toolbox)
                action = text if self.toolbox is None else Action(text, tuple(good))
                obs, reward, terminated, truncated, info = self.env.step(action)
                results = merge_results(obs, good, errors)
                bad = len(good) < len(errors)
                if bad:
                    reward = bad_call_penalty(self.env, self.spec)
            reward = float(reward)
            if not math.isfinite(reward):
                raise ValueError(f"non-finite reward {reward}")
            info = info or {}
            if obs.__class__ is str and IMAGE_MARKER not in obs:  # the hot path
                text, images = obs, None
            else:
                text, images = _observation(obs)
            result = pb.StepResult(
                session_id=self.session_id,
                episode_id=self.episode_id,
                step_index=req.step_index,
                observation=text,
                reward=reward,
                terminated=bool(terminated),
                truncated=bool(truncated),
                action_valid=bool(info.get("action_valid", True)),
                env_seconds=time.perf_counter() - start,
            )
            if images:
                result.images.extend(images)
            if results:
                result.tool_results.extend(results)
                if bad:
                    result.action_valid = False
            metrics = info.get("metrics")
            if metrics:
                target = result.metrics  # update() on the map is slower
                for name, value in metrics.items():
                    target[str(name)] = float(value)
                if bad and "action_valid" in target:  # the runtime's verdict wins
                    target["action_valid"] = 0.0
            # Keys other than the two lifted out go to `info`; the env's dict is never modified.
            if len(info) > ("metrics" in info) + ("action_valid" in info):
                result.info.update(_jsonable({k: v for k, v in info.items() if k not in _LIFTED}))
        except Exception as exc:
            self.done = "aborted"
            raise ProtocolError(
                grpc.StatusCode.INTERNAL, _env_fault(self.spec.env_id, f"step {req.step_index}", exc)
            ) from exc
        self.steps_taken += 1
        self.done = "terminated" if result.terminated else "truncated" if result.truncated else ""
        self.last_step = Answered(req.request_id, req.step_index, result)
        return result


_LIFTED = frozenset(("metrics", "action_valid"))  # info keys sent as StepResult fields


class ImageRuleBroken(ValueError):
    """An env observation that breaks an image rule (named in the message)."""


def _observation(obs: Any) -> tuple[str, list[pb.Image] | None]:
    """The text and images (or None) of an env's observation; raises if it breaks a rule."""
    if obs.__class__ is str and IMAGE_MARKER not in obs:  # the hot path
        return obs, None
    if isinstance(obs, str):
        text, images = obs, ()
    elif isinstance(obs, Observation):
        text, images = obs.text, obs.images
        if not isinstance(text, str):
            raise TypeError(f"Observation.text must be str, got {type(text).__name__}")
    else:
        raise TypeError(f"observation must be str or Observation, got {type(obs).__name__}")
    broken = image_rule_broken(text, images)
    if broken:
        raise ImageRuleBroken(broken)
    return text, [pb.Image(data=image.data, media_type=image.media_type) for image in images] or None


def _env_fault(env_id: str, call: str, exc: Exception) -> str:
    """The INTERNAL message for an env's failure."""
    if isinstance(exc, ImageRuleBroken):
        return f"env '{env_id}' {call}: its observation breaks an image rule (never sent): {exc}"
    if isinstance(exc, ToolRuleBroken):
        return f"env '{env_id}' {call}: its tool results break the rule (never sent): {exc}"
    return f"env '{env_id}' {call} raised {exc!r}"


class SessionTable:
    """All sessions of one server, with capacity, idempotent creation and idle reaping."""

    def __init__(
        self,
        env_ids: list[str],
        *,
        max_sessions: int,
        session_ttl_s: float,
        seed: int | None = None,
        env_configs: Mapping[str, Mapping[str, Any]] | None = None,
    ):
        self.env_ids = list(env_ids)
        self.entries = {env_id: get_env(env_id) for env_id in env_ids}
        # `serve --env-config`: defaults under every client config, and the only way to set server_only fields.
        self.env_configs = {env_id: dict(values) for env_id, values in (env_configs or {}).items()}
        for env_id, values in self.env_configs.items():
            if env_id not in self.entries:
                raise ValueError(f"env_configs: '{env_id}' is not served (served: {', '.join(self.env_ids)})")
            self.entries[env_id].make_config(values)  # fail at startup
        self.max_sessions = max_sessions
        self.session_ttl_s = session_ttl_s
        self.server_id = secrets.token_hex(4)
        self._sessions: dict[str, Session] = {}
        self._created: OrderedDict[str, str] = OrderedDict()  # request_id -> session_id
        self._specs: dict[tuple[str, Any], pb.EnvSpec] = {}
        self._lock = threading.Lock()
        self._seeds = np.random.SeedSequence(seed)

    def __len__(self) -> int:
        return len(self._sessions)

    def entry(self, env_id: str) -> EnvEntry:
        if not env_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "env_id is required")
        if env_id not in self.entries:
            raise ProtocolError(
                grpc.StatusCode.NOT_FOUND, f"env_id '{env_id}' is not served here (served: {', '.join(self.env_ids)})"
            )
        return self.entries[env_id]

    def describe(self, env_id: str, config_struct: Any) -> pb.EnvSpec:
        entry = self.entry(env_id)
        return self._spec(entry, self._config(entry, config_struct))

    def _spec(self, entry: EnvEntry, config: Any) -> pb.EnvSpec:
        key = (entry.env_id, config)
        spec = self._specs.get(key)
        if spec is None:
            if len(self._specs) >= 1024:  # bound the cache
                self._specs.clear()
            spec = self._specs[key] = spec_to_proto(entry.describe(config), entry, config)
        return spec

    def _config(self, entry: EnvEntry, config_struct: Any) -> Any:
        client = json_format.MessageToDict(config_struct)
        for f in dataclasses.fields(entry.config_cls):
            if f.metadata.get("server_only") and f.name in client:
                raise ProtocolError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"config.{f.name} can only be set by the server operator (serve --env-config), not by a client",
                )
        try:
            return entry.make_config({**self.env_configs.get(entry.env_id, {}), **client})
        except ConfigError as exc:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc

    def create(self, req: pb.CreateSessionRequest, *, draining: bool = False) -> pb.CreateSessionResponse:
        if not req.request_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        with self._lock:
            replay = self._created.get(req.request_id)
        if replay is not None:
            session = self.get(replay)
            return pb.CreateSessionResponse(session_id=replay, spec=self._spec(session.entry, session.config))
        if draining:
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE, DRAINING)
        entry = self.entry(req.env_id)
        config = self._config(entry, req.config)
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise ProtocolError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"server {self.server_id} is full ({self.max_sessions} sessions); close sessions or add servers",
                )
            session_id = _new_id(f"s{self.server_id}")
            rng = np.random.default_rng(self._seeds.spawn(1)[0])
        env = None
        try:
            env = entry.make(config)
            spec = entry.describe(config)
            toolbox = ToolBox.of(spec)
        except Exception as exc:
            close_env(env)
            raise ProtocolError(grpc.StatusCode.INTERNAL, f"env '{req.env_id}' failed to start: {exc!r}") from exc
        session = Session(session_id, entry, config, env, spec, rng, toolbox=toolbox)
        response = pb.CreateSessionResponse(session_id=session_id, spec=self._spec(entry, config))
        with self._lock:
            self._sessions[session_id] = session
            self._created[req.request_id] = session_id
            while len(self._created) > 4 * self.max_sessions:
                self._created.popitem(last=False)
        return response

    def fork(self, req: pb.ForkSessionRequest, *, draining: bool = False) -> pb.ForkSessionResponse:
        """``req.copies`` new sessions continuing ``req.session_id``'s episode (the Fork rule of env.proto)."""
        if not req.request_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "request_id is required")
        if not 1 <= req.copies <= MAX_FORK_COPIES:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, f"copies={req.copies}: fork 1 to {MAX_FORK_COPIES}")
        return self.run(req.session_id, lambda session: self._fork(session, req, draining))

    def _fork(self, original: Session, req: pb.ForkSessionRequest, draining: bool) -> pb.ForkSessionResponse:
        if original.last_fork and original.last_fork.request_id == req.request_id:
            return original.last_fork.result
        if draining:
            raise ProtocolError(grpc.StatusCode.UNAVAILABLE, DRAINING)
        env_id = original.spec.env_id
        if not original.entry.forkable:
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION, f"env '{env_id}' cannot be forked (EnvSpec.forkable is false)"
            )
        if not original.in_progress:
            state = f"its episode {original.done}" if original.episode_id else "it was never reset"
            raise ProtocolError(
                grpc.StatusCode.FAILED_PRECONDITION, f"session {original.session_id} has no episode to fork: {state}"
            )
        with self._lock:
            self._room_for(req.copies)
        copies: list[Session] = []
        try:
            for _ in range(req.copies):
                copies.append(
                    Session(
                        _new_id(f"s{self.server_id}"), original.entry, original.config, fork_env(original.env),
                        original.spec, copy.deepcopy(original.rng), episode_id=_new_id("ep"),
                        steps_taken=original.steps_taken, toolbox=original.toolbox,
                    )
                )  # fmt: skip
        except Exception as exc:
            for made in copies:
                close_env(made.env)
            raise ProtocolError(grpc.StatusCode.INTERNAL, _env_fault(env_id, "fork", exc)) from exc
        with self._lock:
            try:
                self._room_for(req.copies)  # sessions made meanwhile may have taken the room
            except ProtocolError:
                for made in copies:
                    close_env(made.env)
                raise
            self._sessions.update((made.session_id, made) for made in copies)
        forks = [pb.ForkedSession(session_id=c.session_id, episode_id=c.episode_id or "") for c in copies]
        result = pb.ForkSessionResponse(forks=forks, step_index=original.steps_taken)
        original.last_fork = Answered(req.request_id, original.steps_taken, result)
        return result

    def _room_for(self, copies: int) -> None:
        """RESOURCE_EXHAUSTED unless ``copies`` more sessions fit (called under the table's lock)."""
        if len(self._sessions) + copies > self.max_sessions:
            raise ProtocolError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"server {self.server_id} has room for {self.max_sessions - len(self._sessions)} more sessions, "
                f"not {copies} copies ({self.max_sessions} at most); close sessions or add servers",
            )

    def find(self, session_id: str) -> Session | None:
        """The session, or None."""
        return self._sessions.get(session_id)

    def get(self, session_id: str) -> Session:
        if not session_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "session_id is required")
        session = self._sessions.get(session_id)
        if session is None:
            raise ProtocolError(grpc.StatusCode.NOT_FOUND, f"session '{session_id}' is unknown or expired")
        return session

    def close(self, session_id: str) -> bool:
        if not session_id:
            raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "session_id is required")
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None:
            close_env(session.env)
        return session is not None

    def run(self, session_id: str, fn: Any) -> Any:
        """Run ``fn(session)`` under the session's lock, safe from reaping."""
        session = self.get(session_id)
        with self._lock:
            session.busy += 1
        try:
            with session.lock:
                return fn(session)
        finally:
            session.last_used = time.monotonic()
            with self._lock:
                session.busy -= 1

    def episodes_in_progress(self) -> int:
        """Sessions with an episode in progress or a call running."""
        with self._lock:
            return sum(session.in_progress or session.busy > 0 for session in self._sessions.values())

    def reap_idle(self, now: float | None = None) -> int:
        """Close sessions idle past the TTL; returns how many."""
        now = time.monotonic() if now is None else now
        return self._close_idle(lambda s: now - s.last_used > self.session_ttl_s)

    def close_all(self) -> int:
        """Close every idle session (the server is stopping); a session whose call still runs keeps its env."""
        return self._close_idle(lambda s: True)

    def _close_idle(self, chosen: Callable[[Session], bool]) -> int:
        """Remove the sessions with no call in flight that ``chosen`` picks, close their envs; returns how many."""
        with self._lock:
            picked = [sid for sid, s in self._sessions.items() if not s.busy and chosen(s)]
            removed = [self._sessions.pop(sid) for sid in picked]
        for session in removed:
            close_env(session.env)
        return len(removed)


def close_env(env: Any) -> None:
    """Release an env that has ``close()`` (optional in the text contract); its errors are not the caller's."""
    close = getattr(env, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            pass
