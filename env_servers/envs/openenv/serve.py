"""Any env of ours as an OpenEnv server (`openenv-core`'s ``create_app``), for OpenEnv clients and the trainers
built on them: ``python -m env_servers openenv frozenlake --port 8000``. Mapping: docs/environments.md.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, ServerMode, State
from pydantic import BaseModel, Field

from env_servers.api import Action as ToolAction
from env_servers.api import Observation as RichObservation
from env_servers.registry import EnvEntry, get_env
from env_servers.server.tools import ToolBox, bad_call_penalty, check_calls, merge_results
from roll_lightning.protocol.v1 import env_pb2 as pb


class ToolCallModel(BaseModel):
    id: str = Field(description="chosen by the client, unique within the step; the result carries it")
    name: str = Field(description="the tool's name")
    arguments: str = Field(default="{}", description="the arguments as a JSON object, as text")


class ToolResultModel(BaseModel):
    call_id: str
    name: str
    content: str
    is_error: bool = False


class ReplyAction(Action):
    """The agent's reply: its text and, for an env with tools, the calls it makes."""

    text: str = Field(default="", description="the reply's text")
    tool_calls: list[ToolCallModel] = Field(default_factory=list, description="tool calls (envs with tools)")


class ReplyObservation(Observation):
    """The env's answer: text (one <image> marker per picture), pictures, one result per tool call."""

    text: str = Field(default="", description="the observation's text")
    images: list[str] = Field(default_factory=list, description="pictures as data: URLs, in marker order")
    tool_results: list[ToolResultModel] = Field(default_factory=list, description="one result per call, in order")
    action_valid: bool = Field(default=True, description="false: the reply was malformed (the env's penalty)")
    truncated: bool = Field(default=False, description="the episode was cut at its step limit (done is also true)")
    metrics: dict[str, float] = Field(default_factory=dict, description="the step's metrics (name -> number)")
    info: dict[str, Any] = Field(default_factory=dict, description="the rest of the env's info")


class ServedEnv(Environment[ReplyAction, ReplyObservation, State]):
    """One OpenEnv session on one of our envs (``entry`` and ``config`` bound by `make_app`)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # our envs own their randomness
    entry: EnvEntry
    config: Any

    def __init__(self) -> None:
        super().__init__()
        self.env = self.entry.make(self.config)
        self.spec = self.entry.describe(self.config)
        self.box = ToolBox.of(self.spec)
        self._state = State(episode_id=None, step_count=0)
        self._over = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> ReplyObservation:
        seed = random.SystemRandom().randrange(2**63) if seed is None else int(seed)
        obs, info = self.env.reset(seed)
        self._state = State(episode_id=episode_id or f"{seed:x}-{random.getrandbits(32):08x}", step_count=0)
        self._over = False
        return _observation(obs, done=False, reward=None, info={"seed": seed, **info})

    def step(self, action: ReplyAction, timeout_s: float | None = None, **_: Any) -> ReplyObservation:
        if self._over:
            raise ValueError("the episode is over (or was never started): reset first")
        calls = [pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments) for c in action.tool_calls]
        good, errors = check_calls(calls, self.box)
        step_input: Any = ToolAction(action.text, tuple(good)) if self.box is not None else action.text
        obs, reward, terminated, truncated, info = self.env.step(step_input)
        results = merge_results(obs, good, errors) if calls else []
        valid = bool(info.get("action_valid", True)) and all(error is None for error in errors)
        if any(error is not None for error in errors):
            reward = bad_call_penalty(self.env, self.spec)
        self._state.step_count += 1
        self._over = bool(terminated or truncated)
        out = _observation(obs, done=self._over, reward=float(reward), info=info)
        out.tool_results = [
            ToolResultModel(call_id=r.call_id, name=r.name, content=r.content, is_error=r.is_error) for r in results
        ]
        out.action_valid, out.truncated = valid, bool(truncated)
        return out

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.spec.env_id,
            description=self.spec.instruction.splitlines()[0] if self.spec.instruction else self.spec.env_id,
            version=self.spec.version,
            author="roll_lightning env_servers",
        )

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _observation(obs: Any, *, done: bool, reward: float | None, info: Mapping[str, Any]) -> ReplyObservation:
    metrics = dict(info.get("metrics") or {})
    rest = {str(k): v for k, v in info.items() if k not in ("action_valid", "metrics")}
    text, images = (obs.text, obs.images) if isinstance(obs, RichObservation) else (str(obs), ())
    urls = [f"data:{i.media_type};base64,{base64.b64encode(i.data).decode()}" for i in images]
    # metadata for in-process users: OpenEnv's wire sends only the fields
    return ReplyObservation(
        text=text,
        images=urls,
        done=done,
        reward=reward,
        metrics=metrics,
        info=rest,
        metadata={"metrics": metrics, **rest},
    )


def make_app(env_id: str, config: Mapping[str, Any] | None = None, max_sessions: int = 64) -> Any:
    """OpenEnv's ASGI app serving ``env_id`` to up to ``max_sessions`` sessions, in OpenEnv's production mode:
    episodes live in ``/ws`` sessions. Its simulation mode's HTTP ``/reset``, ``/step`` and ``/state`` make a
    fresh env for every request, so a step could never follow a reset; they are not offered."""
    entry = get_env(env_id)
    parsed = entry.make_config(config)
    entry.describe(parsed)  # fail before serving
    env_cls = type(f"Served[{env_id}]", (ServedEnv,), {"entry": entry, "config": parsed})
    app = FastAPI(title=f"{env_id}: an env of roll_lightning's env_servers, served as OpenEnv")
    server = HTTPEnvServer(env_cls, ReplyAction, ReplyObservation, max_concurrent_envs=max_sessions)
    server.register_routes(app, mode=ServerMode.PRODUCTION)
    return app
