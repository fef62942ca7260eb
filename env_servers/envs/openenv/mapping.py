"""The OpenEnv adapter's mapping as pure functions (the table in docs/environments.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from env_servers.envs.openenv.backends import ForeignEnvFailed, Outcome

TOOL_FIELDS = ("tool_name", "result", "error", "tools")  # a call_tool answer's fields
FLAGS = ("action_valid", "truncated")
READ = (*FLAGS, "metrics")  # read, not shown as text


ALL_FIELDS = "*"


def observation_text(out: Outcome, field: str, template: str, skip: tuple[str, ...], where: str) -> str:
    """The observation as text: ``template`` filled with its fields; else ``field``; else its only string field;
    else (or with ``field`` ``*``) one ``name: value`` line per field."""
    fields = {k: v for k, v in out.fields.items() if k not in skip and k not in READ}
    if template:
        try:
            return template.format_map({k: as_text(v) for k, v in out.fields.items()})
        except KeyError as exc:
            raise ForeignEnvFailed(
                f"{where}: observation_template names {{{exc.args[0]}}}, which the observation does not have (its "
                f"fields: {', '.join(out.fields)})"
            ) from exc
    if field and field != ALL_FIELDS:
        if field not in out.fields:
            raise ForeignEnvFailed(f"{where}: malformed answer: the observation has no field {field!r}")
        return as_text(out.fields[field])
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(strings) == 1 and field != ALL_FIELDS:
        return strings[0]
    return "\n".join(f"{k}: {as_text(v)}" for k, v in fields.items())


def as_text(value: Any) -> str:
    """A field's value as the model reads it: text as is, a list of plain values comma-separated, else JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return ", ".join(str(v) for v in value)
    return json.dumps(value, sort_keys=True)


def choose_format(schema: dict[str, Any], config: Any) -> tuple[str, str]:
    """``(format, text field)`` from the action's JSON schema and the config."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if takes_text(v)]
    mcp = {"tool_name", "arguments"} <= props.keys()
    chosen = config.action_format
    if chosen == "auto":
        chosen = "tools" if mcp else "text" if (config.action_field or len(strings) == 1) else "json"
    if chosen == "tools" and not mcp:
        raise KeyError("action_format 'tools' needs an MCP env (an action with tool_name and arguments)")
    if chosen == "text":
        name = config.action_field or (strings[0] if len(strings) == 1 else "")
        if name not in strings:
            raise KeyError(
                f"action_format 'text' needs a string field of the action: give action_field (its string fields: "
                f"{', '.join(strings) or 'none'})"
            )
        return chosen, name
    return chosen, ""


def takes_text(prop: Any) -> bool:
    """A JSON-schema property a string fits: ``{"type": "string"}``, or a union with one (pydantic's
    ``Optional[str]`` is ``{"anyOf": [{"type": "string"}, {"type": "null"}]}``)."""
    if not isinstance(prop, dict):
        return False
    kind = prop.get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return True
    return any(takes_text(option) for option in prop.get("anyOf") or prop.get("oneOf") or ())


def dict_of(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def flag(out: Outcome, name: str, default: bool) -> bool:
    """A boolean the env reports as an observation field or metadata key."""
    for value in (out.fields.get(name), out.metadata.get(name)):
        if isinstance(value, bool):
            return value
    return default


def result_text(result: Any) -> str:
    """A call_tool result as text."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        parts = result.get("content")
        if isinstance(parts, list) and parts:
            return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in parts)
        for key in ("data", "structured_content", "structuredContent"):
            if result.get(key) is not None:
                return (
                    result_text(result[key])
                    if isinstance(result[key], str)
                    else json.dumps(result[key], sort_keys=True)
                )
    return json.dumps(result, sort_keys=True, default=str)


def error_text(error: Any) -> str:
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


def plain(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-representable part of an observation's metadata."""
    out = {}
    for key, value in metadata.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[str(key)] = value
    return out
