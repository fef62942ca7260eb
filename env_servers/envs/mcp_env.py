"""Any MCP server's tools as a tool env: ids ``mcp:<module>:<TaskClass>`` (optional `[mcp]` extra).

    python -m env_servers serve mcp:my_pkg.tasks:Capitals \\
        --env-config 'mcp:my_pkg.tasks:Capitals={"server_command": ["python", "-m", "my_pkg.server"]}'

The server supplies the tools; the task class supplies ``instruction()``, ``start(seed, tools)`` and
``reward(history, reply) -> (reward, terminated)`` ("MCP servers as envs" in docs/writing-an-env.md). A tool
error or timeout is a valid action; a server that dies mid-episode fails that step and restarts at the next reset.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import Action, ConfigError, EnvSpec, Observation, Tool, ToolCall, ToolResult, json_object
from env_servers.envs.mcp_client import McpConnection
from env_servers.envs.mcp_tools import from_mcp, run_call, validator
from env_servers.registry import EnvEntry, register_prefix

PREFIX = "mcp:"
_SERVER_ONLY = {"server_only": True}  # a client must never choose what the server runs


@dataclass(frozen=True)
class McpConfig:
    server_command: tuple[str, ...] = field(
        default=(), metadata={"doc": "stdio MCP server: the command line that starts it", **_SERVER_ONLY}
    )
    url: str = field(
        default="", metadata={"doc": "streamable-HTTP MCP server endpoint (instead of a command)", **_SERVER_ONLY}
    )
    server_cwd: str = field(default="", metadata={"doc": "working directory of the stdio server", **_SERVER_ONLY})
    server_env: str = field(
        default="{}",
        metadata={"doc": "JSON object of extra environment variables for the stdio server", **_SERVER_ONLY},
    )
    task_config: str = field(default="{}", metadata={"doc": "JSON object of keyword arguments for the task class"})
    max_steps: int = field(default=10, metadata={"doc": "turns before we truncate"})
    bad_call_penalty: float = field(default=-0.1, metadata={"doc": "a step's reward when one of its calls was bad"})
    max_calls_per_step: int = field(default=8, metadata={"doc": "calls past this many in one step are refused"})
    max_result_chars: int = field(default=8192, metadata={"doc": "a longer tool result is cut to this many chars"})
    start_timeout_s: float = field(default=30.0, metadata={"doc": "seconds for the server to start and list tools"})
    call_timeout_s: float = field(default=30.0, metadata={"doc": "seconds for one tool call"})
    restart_per_episode: bool = field(default=False, metadata={"doc": "a fresh server for every episode (state)"})

    def __post_init__(self) -> None:
        if self.server_command and self.url:
            raise ValueError("give server_command or url, not both")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be http:// or https://, got {self.url!r}")
        env = json_object(self.server_env, "server_env")
        if not all(isinstance(v, str) for v in env.values()):
            raise ValueError("server_env values must be strings")
        json_object(self.task_config, "task_config")
        for name in ("max_steps", "max_calls_per_step", "max_result_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("start_timeout_s", "call_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


_TOOLS: dict[tuple[str, McpConfig], tuple[Tool, ...]] = {}  # so describe needs no server


class McpEnv:
    """A task instance and a connection to its MCP server."""

    env_id = ""
    task_cls: type = object
    waits_on_io = True  # the runtime overlaps a batch's steps on threads

    def __init__(self, config: McpConfig) -> None:
        self.config = config
        self.task = self.task_cls(**json_object(config.task_config, "task_config"))
        self.local = {tool.name: tool for tool in getattr(self.task, "tools", ())}
        self._conn: McpConnection | None = None
        self._history: list[tuple[ToolCall, ToolResult]] = []
        self._steps = 0
        self._connect()

    def _connect(self) -> None:
        command = self.config.server_command or (() if self.config.url else tuple(self.task.server_command))
        self._conn = McpConnection(
            command=command,
            url=self.config.url,
            cwd=self.config.server_cwd or (getattr(self.task, "server_cwd", "") if command else ""),
            env=json_object(self.config.server_env, "server_env"),
            start_timeout_s=self.config.start_timeout_s,
            call_timeout_s=self.config.call_timeout_s,
        )
        remote = tuple(from_mcp(tool) for tool in self._conn.tools)
        clash = sorted(self.local.keys() & {tool.name for tool in remote})
        if clash:
            self.close()
            raise RuntimeError(f"task tool {clash[0]!r} is also a tool of the MCP server ({self._conn.target})")
        self.tools = (*self.local.values(), *remote)
        self._validators = {tool.name: validator(tool.parameters) for tool in self.tools}
        if len(_TOOLS) >= 256:
            _TOOLS.clear()
        _TOOLS[(self.env_id, self.config)] = self.tools
        self._fresh = True

    @property
    def bad_call_penalty(self) -> float:
        """The reward of a step with a bad call, also for calls the runtime refuses."""
        return self.config.bad_call_penalty

    def close(self) -> None:
        """Stop the MCP session and its server process."""
        if self._conn is not None:
            self._conn.close()

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        if self._conn is None or not self._conn.alive or (self.config.restart_per_episode and not self._fresh):
            self.close()
            self._connect()
        self._fresh = not self.config.restart_per_episode
        self._history, self._steps = [], 0
        return self.task.start(seed, self.tools), {"seed": seed, "tools": len(self.tools)}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        if isinstance(action, str):  # a runtime that sends no Action
            action = Action(text=action)
        self._steps += 1
        results, valid = [], True
        for index, call in enumerate(action.tool_calls):
            if index >= self.config.max_calls_per_step:
                result, ok = ToolResult(call.id, call.name, "not run: too many calls in one step", True), False
            else:
                result, ok = run_call(self, call)
            results.append(result)
            valid &= ok
            self._history.append((call, result))
        history = tuple(self._history)
        reward, terminated = self.task.reward(history, action.text)
        reward, terminated = (float(reward) if valid else self.config.bad_call_penalty), bool(terminated)
        truncated = not terminated and self._steps >= self.config.max_steps
        observe = getattr(self.task, "observe", None)
        text = observe(history, action.text, terminated) if observe else ""
        errors = sum(result.is_error for result in results)
        metrics = {"action_valid": float(valid), "tool_calls": float(len(results)), "tool_errors": float(errors)}
        info = {"action_valid": valid, "metrics": metrics}
        return Observation(text=text, tool_results=tuple(results)), reward, terminated, truncated, info

    @classmethod
    def describe(cls, config: McpConfig) -> EnvSpec:
        tools = _TOOLS.get((cls.env_id, config))
        if tools is None:  # start the server once to list its tools
            probe = cls(config)
            probe.close()
            tools = probe.tools
        task = cls.task_cls(**json_object(config.task_config, "task_config"))
        low, high = (float(v) for v in getattr(task, "reward_range", (0.0, 1.0)))
        return EnvSpec(
            env_id=cls.env_id,
            version=f"mcp-{getattr(task, 'version', '1')}",
            instruction=task.instruction(),
            action_format="tool calls to the tools of this spec (arguments: a JSON object per the tool's schema)",
            example_action=getattr(task, "example_action", ""),
            max_steps=config.max_steps,
            reward_min=min(low, config.bad_call_penalty),
            reward_max=max(high, config.bad_call_penalty),
            deterministic=bool(getattr(task, "deterministic", True)),
            splits=dict(getattr(task, "splits", {"train": 0})),
            metrics=("action_valid", "tool_calls", "tool_errors"),
            tools=tools,
        )


@dataclass(frozen=True)
class McpEntry(EnvEntry):
    """The registry entry of one task; checks that a server is named."""

    def make_config(self, values: Mapping[str, Any] | None) -> Any:
        config = super().make_config(values)
        if not config.server_command and not config.url and not getattr(self.env_cls.task_cls, "server_command", ()):
            raise ConfigError(f"config.server_command: env '{self.env_id}' needs an MCP server (server_command or url)")
        return config


def _entry(env_id: str) -> EnvEntry:
    ref = env_id[len(PREFIX) :]
    module_name, _, class_name = ref.rpartition(":")
    if not module_name or not class_name:
        raise KeyError(f"'{env_id}': name a task class after 'mcp:', e.g. mcp:my_pkg.tasks:MyTask")
    try:
        task_cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise KeyError(f"'{env_id}': cannot load the task class {ref!r} ({exc})") from exc
    missing = [name for name in ("instruction", "start", "reward") if not callable(getattr(task_cls, name, None))]
    if missing:
        raise KeyError(f"'{env_id}': the task class {ref!r} lacks {', '.join(missing)}")
    env_cls = type(f"Mcp[{ref}]", (McpEnv,), {"env_id": env_id, "task_cls": task_cls})
    return McpEntry(env_id, env_cls, McpConfig)


register_prefix(PREFIX, _entry)
