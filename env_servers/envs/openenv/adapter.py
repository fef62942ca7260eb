"""Any OpenEnv environment as one of our envs: ids ``openenv:<module>:<Environment class or factory>`` (run here,
through `openenv-core`) or ``openenv:<http(s)://host:port>`` (a running OpenEnv server).

    python -m env_servers serve openenv:my_env.server.my_environment:MyEnvironment
    python -m env_servers serve openenv:http://127.0.0.1:8000

The mapping is the table in docs/environments.md.
"""

from __future__ import annotations

import json
import string
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import Action, EnvSpec, Observation, Tool, ToolResult, json_object, package_version
from env_servers.envs.openenv.backends import (
    ForeignEnvFailed,
    InProcess,
    InvalidAction,
    Outcome,
    Remote,
    SessionsFull,
    load,
)
from env_servers.envs.openenv.mapping import (
    FLAGS,
    TOOL_FIELDS,
    choose_format,
    dict_of,
    error_text,
    flag,
    observation_text,
    plain,
    result_text,
)
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "openenv:"
FORMATS = ("auto", "text", "json", "tools")
_REMOTE = ("http://", "https://", "ws://", "wss://")


@dataclass(frozen=True)
class OpenEnvConfig:
    max_steps: int = field(default=50, metadata={"doc": "turns before we truncate"})
    action_format: str = field(
        default="auto", metadata={"doc": "how a reply becomes an action: " + " | ".join(FORMATS)}
    )
    action_field: str = field(default="", metadata={"doc": "text format: the action field given the reply"})
    observation_field: str = field(
        default="",
        metadata={"doc": "the observation field shown as text (default: the only string field); * shows every field"},
    )
    observation_template: str = field(
        default="",
        metadata={"doc": "the observation as text from its fields, e.g. '{board}\\nLegal moves: {legal_moves}'"},
    )
    action_class: str = field(
        default="",
        metadata={"doc": "module:Class of the action (in-process envs that do not declare it)", "server_only": True},
    )
    reset_kwargs: str = field(default="{}", metadata={"doc": "JSON object of extra keyword arguments for reset"})
    instruction: str = field(
        default="",
        metadata={"doc": "the spec's instruction (default: the first observation, else the env's description)"},
    )
    example_action: str = field(default="", metadata={"doc": "the spec's example action"})
    invalid_action_penalty: float = field(default=-0.1, metadata={"doc": "reward of a reply that is no action"})
    reward_min: float = field(default=-1.0, metadata={"doc": "the spec's lowest reward"})
    reward_max: float = field(default=1.0, metadata={"doc": "the spec's highest reward"})
    deterministic: bool = field(default=True, metadata={"doc": "false for an env that does not follow its seed"})
    max_sessions: int = field(
        default=0,
        metadata={
            "doc": "episodes at once the OpenEnv server takes (the trainer starts no more); 0: a URL's is asked at "
            "describe (a second session, which a full server refuses naming its limit), an in-process env has none"
        },
    )
    connect_timeout_s: float = field(default=10.0, metadata={"doc": "seconds to connect to a server"})
    call_timeout_s: float = field(default=30.0, metadata={"doc": "seconds for one reset or step"})

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.action_format not in FORMATS:
            raise ValueError(f"action_format must be one of {', '.join(FORMATS)}, got {self.action_format!r}")
        json_object(self.reset_kwargs, "reset_kwargs")
        try:
            list(string.Formatter().parse(self.observation_template))
        except ValueError as exc:
            raise ValueError(f"observation_template {self.observation_template!r}: {exc}") from exc
        if self.max_sessions < 0:
            raise ValueError(f"max_sessions must be >= 0 (0: ask the server), got {self.max_sessions}")
        for name in ("connect_timeout_s", "call_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


_TOOLS: dict[tuple[str, OpenEnvConfig], tuple[Tool, ...]] = {}  # listed once per config
_SCHEMAS: dict[str, dict[str, Any]] = {}


class OpenEnvEnv:
    """One OpenEnv session: a backend (`InProcess` or `Remote`) and the mapping."""

    env_id = ""
    target = ""  # module:Class or a URL

    def __init__(self, config: OpenEnvConfig) -> None:
        self.config = config
        self.waits_on_io = self.target.startswith(_REMOTE)
        self.backend = self._open()
        if self.target not in _SCHEMAS:  # once per target
            _SCHEMAS[self.target] = self.backend.action_schema()
        self.format, self.field = choose_format(_SCHEMAS[self.target], config)
        self._steps = 0

    @property
    def tools(self) -> tuple[Tool, ...]:
        return self._list_tools() if self.format == "tools" else ()

    def _open(self) -> InProcess | Remote:
        if self.target.startswith(_REMOTE):
            return Remote(self.target, self.config.connect_timeout_s, self.config.call_timeout_s)
        return InProcess(load(self.target), self.config.action_class, self.config.call_timeout_s)

    def _list_tools(self) -> tuple[Tool, ...]:
        key = (self.env_id, self.config)
        if key not in _TOOLS:
            listed = self.backend.step({"type": "list_tools"}).fields.get("tools")
            if not isinstance(listed, list):
                raise ForeignEnvFailed(f"{self.target}: list_tools answered no tool list")
            _TOOLS[key] = tuple(
                Tool(
                    str(t["name"]), str(t.get("description") or ""), t.get("input_schema") or t.get("inputSchema") or {}
                )
                for t in listed
            )
        return _TOOLS[key]

    def close(self) -> None:
        self.backend.close()

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._steps = 0
        kwargs = json_object(self.config.reset_kwargs, "reset_kwargs")
        deadline = time.monotonic() + self.config.connect_timeout_s
        while True:  # a session closed just before may not have left the server yet
            try:
                out = self.backend.reset(seed % 2**32, kwargs)
                break
            except SessionsFull:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        return self._text(out), {"seed": seed, "metadata": plain(out.metadata)}

    def step(self, action: Action | str) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]:
        action = Action(text=action) if isinstance(action, str) else action
        self._steps += 1
        if self.format == "tools":
            return self._tool_step(action)
        try:
            out = self.backend.step(self._action(action.text))
        except InvalidAction as exc:
            return self._refused(f"Invalid action: {exc}")
        return self._text(out), *self._scored(out, out.reward or 0.0)

    def _action(self, text: str) -> dict[str, Any]:
        if self.format == "text":
            return {self.field: text}
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidAction(f"the reply is not JSON ({exc.msg})") from exc
        if not isinstance(value, dict):
            raise InvalidAction("the reply must be a JSON object of the action's fields")
        return value

    def _tool_step(self, action: Action) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if not action.tool_calls:
            names = ", ".join(tool.name for tool in self.tools)
            text, reward, terminated, truncated, info = self._refused(f"Reply with tool calls ({names}).")
            return Observation(text=text), reward, terminated, truncated, info
        results, reward, last = [], 0.0, None
        for call in action.tool_calls:
            if last is not None and last.done:
                results.append(ToolResult(call.id, call.name, "not run: the episode ended", True))
                continue
            try:
                last = self.backend.step(
                    {"type": "call_tool", "tool_name": call.name, "arguments": json.loads(call.arguments)}
                )
            except InvalidAction as exc:
                results.append(ToolResult(call.id, call.name, f"invalid call: {exc}", True))
                continue
            error = last.fields.get("error")
            content = error_text(error) if error else result_text(last.fields.get("result"))
            results.append(ToolResult(call.id, call.name, content, bool(error)))
            reward += last.reward or 0.0
        if last is None:
            return Observation(text="", tool_results=tuple(results)), *self._refused_scores()
        text = self._text(last, skip=TOOL_FIELDS)
        return Observation(text=text, tool_results=tuple(results)), *self._scored(last, reward)

    def _scored(self, out: Outcome, reward: float) -> tuple[float, bool, bool, dict[str, Any]]:
        valid = flag(out, "action_valid", True)
        cut = out.done and flag(out, "truncated", False)
        numbers = {**out.metadata, **dict_of(out.metadata.get("metrics")), **dict_of(out.fields.get("metrics"))}
        metrics = {k: float(v) for k, v in numbers.items() if isinstance(v, int | float) and k not in FLAGS}
        metrics["action_valid"] = float(valid)
        info = {"action_valid": valid, "metrics": metrics, "metadata": plain(out.metadata)}
        return reward, out.done and not cut, cut or (not out.done and self._steps >= self.config.max_steps), info

    def _refused(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return text, *self._refused_scores()

    def _refused_scores(self) -> tuple[float, bool, bool, dict[str, Any]]:
        truncated = self._steps >= self.config.max_steps
        info = {"action_valid": False, "metrics": {"action_valid": 0.0}}
        return self.config.invalid_action_penalty, False, truncated, info

    def _text(self, out: Outcome, skip: tuple[str, ...] = ()) -> str:
        config = self.config
        return observation_text(out, config.observation_field, config.observation_template, skip, self.target)

    @classmethod
    def describe(cls, config: OpenEnvConfig) -> EnvSpec:
        """The spec, from a probe session (`EnvEntry.describe` keeps it per config)."""
        probe = cls(config)
        try:
            first, _ = probe.reset(0)
            instruction = config.instruction or first or probe.backend.description() or f"the OpenEnv env {cls.target}"
            tools = probe.tools
            max_sessions = config.max_sessions or probe.sessions_beside()
        finally:
            probe.close()
        call = json.dumps({"name": tools[0].name, "arguments": {}}) if tools else ""
        examples = {"text": "hello", "json": "{}", "tools": call}
        low = min(config.reward_min, config.invalid_action_penalty)
        return EnvSpec(
            env_id=cls.env_id,
            version=f"openenv-core-{package_version('openenv-core')}",
            instruction=instruction,
            action_format={
                "text": f"free text (sent as the action's {probe.field!r})",
                "json": "a JSON object of the action's fields",
                "tools": "tool calls to the tools of this spec",
            }[probe.format],
            example_action=config.example_action or examples[probe.format],
            max_steps=config.max_steps,
            reward_min=low,
            reward_max=max(config.reward_max, low),
            deterministic=config.deterministic,
            splits={"train": 0, "test": 0},
            metrics=("action_valid",),
            tools=tools,
            max_sessions=max_sessions,
        )

    def sessions_beside(self) -> int:
        """The server's session limit when a second session beside this (reset) one is refused, else 0. An
        in-process env makes an instance per session: 0."""
        if not isinstance(self.backend, Remote):
            return 0
        second = Remote(self.target, self.config.connect_timeout_s, self.config.call_timeout_s)
        try:
            second.reset(1, json_object(self.config.reset_kwargs, "reset_kwargs"))
        except SessionsFull as full:
            return full.max_sessions
        finally:
            second.close()
        return 0


def _entry(env_id: str) -> EnvEntry:
    target = env_id[len(PREFIX) :]
    if not target.startswith(_REMOTE):
        module, _, name = target.rpartition(":")
        if not module or not name:
            raise KeyError(
                f"'{env_id}': name an Environment class (openenv:my_pkg.server.env:MyEnvironment) or a server URL "
                "(openenv:http://host:8000) after 'openenv:'"
            )
        try:
            from openenv.core.env_server.interfaces import Environment
        except ImportError as exc:
            raise KeyError(
                "OpenEnv envs need the optional openenv-core package: pip install 'roll_lightning[openenv]'"
            ) from exc
        factory = load(target)
        if not (isinstance(factory, type) and issubclass(factory, Environment)) and not callable(factory):
            raise KeyError(f"'{env_id}': {target} is neither an OpenEnv Environment class nor a function making one")
    env_cls = type(f"OpenEnv[{target}]", (OpenEnvEnv,), {"env_id": env_id, "target": target})
    return EnvEntry(env_id, env_cls, OpenEnvConfig)


register_prefix(PREFIX, _entry)
