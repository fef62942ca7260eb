"""One tool call of an `mcp:` env: checked, run (task-local or on the MCP server), and made a `ToolResult`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from env_servers.api import Tool, ToolCall, ToolResult


def from_mcp(tool: Any) -> Tool:
    """Our `Tool` from an `mcp.types.Tool`."""
    return Tool(name=tool.name, description=tool.description or "", parameters=dict(tool.input_schema))


def validator(schema: Mapping[str, Any]) -> Any:
    """A validator for a tool's arguments, or None if the schema is unusable (then the server judges)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return cls(schema)


def _problem(env: Any, call: ToolCall) -> tuple[str, dict[str, Any]]:
    """What is wrong with a call ('' for nothing) and its parsed arguments."""
    if call.name not in env._validators:
        return f"unknown tool {call.name!r} (tools: {', '.join(t.name for t in env.tools)})", {}
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return f"arguments are not JSON: {exc}", {}
    if not isinstance(arguments, dict):
        return "arguments must be a JSON object", {}
    check = env._validators[call.name]
    error = next(iter(check.iter_errors(arguments)), None) if check is not None else None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        return f"arguments do not match the schema{f' at {where}' if where else ''}: {error.message}", {}
    return "", arguments


def run_call(env: Any, call: ToolCall) -> tuple[ToolResult, bool]:
    """One call's result and whether the call was valid."""
    problem, arguments = _problem(env, call)
    if problem:
        return ToolResult(call.id, call.name, problem, is_error=True), False
    if call.name in env.local:
        out = env.task.call(call, arguments)
        return (out if isinstance(out, ToolResult) else ToolResult(call.id, call.name, str(out))), True
    from mcp.shared.exceptions import MCPError

    try:
        result = env._conn.call(call.name, arguments)
    except TimeoutError as exc:
        return ToolResult(call.id, call.name, f"error: {exc}", is_error=True), True
    except MCPError as exc:  # a protocol-level refusal (e.g. invalid params): the call's fault
        return ToolResult(call.id, call.name, f"error: {exc}", is_error=True), False
    text = result_text(result, env.config.max_result_chars)
    return ToolResult(call.id, call.name, text, is_error=bool(result.is_error)), True


def result_text(result: Any, limit: int) -> str:
    """A `CallToolResult`'s text parts, placeholders for the rest, cut to ``limit``."""
    parts, texts = [], 0
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
            texts += 1
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
            texts += 1
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        else:  # no pictures through tool results
            mime = getattr(block, "mime_type", None) or getattr(getattr(block, "resource", None), "mime_type", None)
            parts.append(f"[{kind or 'content'} omitted{f': {mime}' if mime else ''}]")
    if not texts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
    text = "\n".join(parts)
    if len(text) > limit:
        text = text[:limit] + f"\n[... cut: {len(text) - limit} more characters]"
    return text
