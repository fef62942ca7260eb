"""The OpenEnv adapter's mapping as pure functions (the table in docs/environments.md)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from env_servers.envs.openenv.backends import ForeignEnvFailed, Outcome

TOOL_FIELDS = ("tool_name", "result", "error", "tools")  # a call_tool answer's fields
FLAGS = ("action_valid", "truncated")
READ = (*FLAGS, "metrics")  # read, not shown as text


def observation_text(out: Outcome, field: str, skip: tuple[str, ...], where: str) -> str:
    """The observation's ``field``, else its only string field, else one ``name: value`` line per field."""
    fields = {k: v for k, v in out.fields.items() if k not in skip and k not in READ}
    if field:
        if field not in out.fields:
            raise ForeignEnvFailed(f"{where}: malformed answer: the observation has no field {field!r}")
        value = out.fields[field]
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for k, v in fields.items())


def choose_format(schema: dict[str, Any], config: Any) -> tuple[str, str]:
    """``(format, text field)`` from the action's JSON schema and the config."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    strings = [k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"]
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
