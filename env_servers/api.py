"""The contract between an environment class and the server runtime.

An env is any class with GEM/Gymnasium text semantics:

    env = MyEnv(config)                       # config: the env's own frozen dataclass
    obs, info = env.reset(seed, options)      # seed: always an int (the runtime draws one if the client gave none)
    obs, reward, terminated, truncated, info = env.step(action_text)
    spec = MyEnv.describe(config)             # an EnvSpec, served by DescribeEnv

An observation is a string, or an `Observation`: text plus images, each image standing where the text holds
an `IMAGE_MARKER` (one marker per image, in order; the proto header has the rules and limits, which
`env_servers.images` checks).

Tool envs: an env whose `EnvSpec.tools` is not empty receives an `Action` (the reply's text and its parsed
`ToolCall`s) in ``step`` instead of the text, and answers each call with a `ToolResult` in its `Observation`'s
``tool_results`` (a bad call is a normal step: ``action_valid`` False, the env's penalty, an error result).

Rules the runtime relies on (and the conformance tests check):
- every instance owns its randomness (a `numpy.random.Generator` / `random.Random` built from the reset seed),
  never the process-global RNGs, so the same seed gives the same start state whatever else the process runs;
- a bad LLM reply is a normal step: set ``info["action_valid"] = False`` and apply the env's format penalty,
  never raise; an exception from `step` is treated as an env crash (the item fails with INTERNAL);
- ``info["metrics"]`` (name -> float) carries per-step metrics; everything else in ``info`` must be
  JSON-serialisable and travels as a protobuf Struct.

This module never imports grpc: an env can be written and unit-tested without the transport.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class ConfigError(ValueError):
    """An env config that cannot be used; the message names the offending key."""


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
    # split name -> number of tasks; 0 means procedurally generated from the seed (unbounded).
    splits: Mapping[str, int] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    tools: tuple[Tool, ...] = ()  # the tools the agent may call (empty: a text env)


@dataclass(frozen=True)
class Tool:
    """A tool the agent may call: its name, what it does, and its arguments as a JSON Schema object."""

    name: str
    description: str
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolCall:
    """One call the agent made: ``id`` (chosen by the client, echoed by the result), the tool's name, and the
    arguments as the JSON text the model wrote (unparsed: a bad call is the env's to judge)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolResult:
    """What one call returned, under its call's id (``is_error``: the call failed, e.g. an unknown tool)."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


@dataclass(frozen=True)
class Action:
    """A tool env's step input: the reply's text and the calls parsed out of it (in order)."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()


IMAGE_MARKER = "<image>"
"""Where an image stands in an observation's text: one marker per image, in the images' order."""


@dataclass(frozen=True)
class Image:
    """One encoded picture of an observation (``media_type`` ``image/png`` or ``image/jpeg``)."""

    data: bytes
    media_type: str = "image/png"


@dataclass(frozen=True)
class Observation:
    """What an env shows the agent beyond plain text: pictures (one `IMAGE_MARKER` in the text per image) and the
    results of the calls the step carried (one per call, in the calls' order)."""

    text: str
    images: tuple[Image, ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


class TextEnv(Protocol):
    """Structural type of an env served by `env_servers` (see the module docstring)."""

    def reset(
        self, seed: int, options: Mapping[str, Any] | None = None
    ) -> tuple[str | Observation, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]: ...


def parse_config(config_cls: type, values: Mapping[str, Any] | None, *, env_id: str) -> Any:
    """Build ``config_cls`` (a dataclass) from JSON-like ``values``, naming any bad key in the error.

    Lists are accepted for tuple fields (JSON has no tuples); ints are accepted for float fields;
    protobuf Struct numbers arrive as floats, so integral floats are accepted for int fields.
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
    """Parse a config field that holds a JSON object (e.g. adapters' ``make_kwargs``); ValueError names the field."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object")
    return value


def package_version(distribution: str) -> str:
    """The installed version of ``distribution`` (an adapter's spec version names the library it wraps)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"


def config_schema(config_cls: type) -> str:
    """A JSON Schema (as text) of a config dataclass: field names, types and defaults."""
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
