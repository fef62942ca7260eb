"""The contract between an env class and the server runtime (guide: docs/writing-an-env.md).

    env = MyEnv(config)                       # config: the env's own frozen dataclass
    obs, info = env.reset(seed, options)      # seed: always an int (drawn by the runtime if the client gave none)
    obs, reward, terminated, truncated, info = env.step(action_text)
    spec = MyEnv.describe(config)             # an EnvSpec
    copy = env.fork()                         # optional: a copy that steps exactly as env would (ForkSession)

``obs`` is a string or an `Observation` (text with one `IMAGE_MARKER` per image). An env with ``EnvSpec.tools``
gets an `Action` in ``step`` and answers each call with a `ToolResult`.

Rules (checked by the conformance suite):
- randomness comes from the reset seed via the instance's own RNG, never the process-global ones;
- a bad reply is a normal step (``info["action_valid"] = False``, the env's penalty); an exception from
  ``step`` is an env crash (INTERNAL);
- ``info["metrics"]`` maps name -> float; the rest of ``info`` must be JSON-serialisable.

An env is forkable (sessions copied mid-episode, the Fork rule of env.proto) when its class defines ``fork()``
or sets ``forkable = True``, which makes the runtime deep-copy it: right for an env whose whole state is plain
Python and numpy objects. ``fork()`` is for state that must be shared (a read-only catalogue) or cannot be copied.

No grpc here: an env can be written and tested without the transport.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class ConfigError(ValueError):
    """An env config that cannot be used; the message names the offending key."""


class EnvUnavailable(RuntimeError):
    """An env that cannot be reached or used (a foreign server that is down or serves something else); the
    message names the cause in one line, and the command line prints only it."""


@dataclass(frozen=True)
class EnvSpec:
    """What a client needs to know to drive an env without reading its code."""

    env_id: str
    version: str
    instruction: str
    action_format: str
    example_action: str
    max_steps: int
    reward_min: float
    reward_max: float
    deterministic: bool = True
    # split name -> number of tasks; 0: generated from the seed (unbounded)
    splits: Mapping[str, int] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    tools: tuple[Tool, ...] = ()  # empty: a text env
    max_sessions: int = 0  # episodes that may run at once (a one-session backend: 1); clients start no more. 0: any


@dataclass(frozen=True)
class Tool:
    """A tool the agent may call: its name, what it does, and its arguments as a JSON Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolCall:
    """One call the agent made; ``arguments`` is the model's JSON text, unparsed (the env judges a bad call)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    """What one call returned, under its call's id."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Action:
    """A tool env's step input: the reply's text and its calls, in order."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()


IMAGE_MARKER = "<image>"
"""Where an image stands in an observation's text, one per image, in order."""


@dataclass(frozen=True)
class Image:
    """One encoded picture (PNG or JPEG)."""

    data: bytes
    media_type: str = "image/png"


@dataclass(frozen=True)
class Observation:
    """An observation with pictures and/or tool results (one per call, in call order)."""

    text: str
    images: tuple[Image, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


class TextEnv(Protocol):
    """Structural type of an env (see the module docstring)."""

    def reset(
        self, seed: int, options: Mapping[str, Any] | None = None
    ) -> tuple[str | Observation, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]: ...


def can_fork(env_cls: type) -> bool:
    """Whether sessions of ``env_cls`` can be forked: it defines ``fork()`` or sets ``forkable = True``."""
    return callable(getattr(env_cls, "fork", None)) or getattr(env_cls, "forkable", False) is True


def fork_env(env: Any) -> Any:
    """A copy of ``env`` that steps exactly as ``env`` would from here and shares nothing a step changes: its own
    ``fork()``, else a deep copy (RNGs included, so a copy draws what the original would)."""
    fork = getattr(env, "fork", None)
    return fork() if callable(fork) else copy.deepcopy(env)


def parse_config(config_cls: type, values: Mapping[str, Any] | None, *, env_id: str) -> Any:
    """Build the dataclass ``config_cls`` from JSON-like ``values``; a ConfigError names any bad key.

    Lists fill tuple fields, and integral floats int fields (protobuf Struct numbers are floats).
    """
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"config.{unknown[0]}: unknown key for env '{env_id}' (known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(config_cls)
    kwargs = {name: _coerce(hints[name], value, f"config.{name}") for name, value in values.items()}
    try:
        return config_cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env '{env_id}': {exc}") from exc


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(options[0], value, where)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected a boolean, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(hint)
        item_types = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            raise ConfigError(f"{where}: expected {len(item_types)} items, got {len(value)}")
        return tuple(_coerce(t, v, f"{where}[{i}]") for i, (t, v) in enumerate(zip(item_types, value, strict=True)))
    return value


def json_object(text: str, where: str) -> dict[str, Any]:
    """Parse a config field holding a JSON object; ValueError names the field."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object")
    return value


def package_version(distribution: str) -> str:
    """The installed version of ``distribution``, or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def config_schema(config_cls: type) -> str:
    """A config dataclass as JSON Schema text."""
    hints = typing.get_type_hints(config_cls)
    props: dict[str, Any] = {}
    for f in dataclasses.fields(config_cls):
        entry = _json_type(hints[f.name])
        if f.default is not dataclasses.MISSING:
            entry["default"] = list(f.default) if isinstance(f.default, tuple) else f.default
        doc = f.metadata.get("doc")
        if doc:
            entry["description"] = doc
        props[f.name] = entry
    return json.dumps({"type": "object", "additionalProperties": False, "properties": props}, sort_keys=True)


def _json_type(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return {"anyOf": [_json_type(options[0]), {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "items": _json_type(typing.get_args(hint)[0])}
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    return {"type": names.get(hint, "object")}
