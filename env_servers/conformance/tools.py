"""The tool rules (env.proto's header, "Tools"), checked on servers that advertise "tools".

A valid call gets one result with its id; each kind of bad call is a normal step with action_valid=false and
an error result, never an RPC error.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from env_servers.conformance.target import CODE, CheckFailed, Suite, expect, rid, step_request
from roll_lightning.protocol.v1 import env_pb2 as pb

_SAMPLES = {"string": "1", "number": 1, "integer": 1, "boolean": False, "array": [], "object": {}, "null": None}


def sample_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit a simple object schema (required properties only)."""
    properties = schema.get("properties") or {}
    out = {}
    for name in schema.get("required") or ():
        prop = properties.get(name) or {}
        kind = prop.get("type", "string")
        out[name] = prop["enum"][0] if prop.get("enum") else _SAMPLES.get(kind if isinstance(kind, str) else kind[0])
    return out


def breaking_arguments(schema: dict[str, Any]) -> str | None:
    """Arguments (JSON text) that fail the schema, or None when this simple search finds none."""
    if schema.get("required"):
        return "{}"
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("type") in ("number", "integer", "boolean", "array", "object"):
            return json.dumps({name: "not a " + prop["type"]})
        if prop.get("type") == "string":
            return json.dumps({name: 12345})
    if schema.get("additionalProperties") is False:
        return json.dumps({"no_such_argument_" + uuid.uuid4().hex[:6]: 1})
    return None


def _call(call_id: str, name: str, arguments: str) -> pb.ToolCall:
    return pb.ToolCall(id=call_id, name=name, arguments_json=arguments)


def _first_step(s: Suite, calls: list[pb.ToolCall], text: str = "") -> pb.StepResult:
    """A fresh episode's first step carrying ``calls``; an RPC error fails the check."""
    session = s.t.open()
    episode = s.t.reset(session, 11).episode_id
    request = step_request(session, episode, 0, text)
    request.action.tool_calls.extend(calls)
    return s.t.call("Step", request)


def _expect_results(where: str, out: pb.StepResult, calls: list[pb.ToolCall]) -> None:
    expect(out.status.code == 0, f"{where} failed: {CODE[out.status.code].name} {out.status.message}")
    got = [r.call_id for r in out.tool_results]
    expect(got == [c.id for c in calls], f"{where}: results carry call ids {got}, not {[c.id for c in calls]}")


def _expect_bad(s: Suite, where: str, calls: list[pb.ToolCall]) -> None:
    out = _first_step(s, calls)
    _expect_results(where, out, calls)
    expect(not out.action_valid, f"{where} was answered action_valid=true")
    expect(any(r.is_error for r in out.tool_results), f"{where}: no result is an error (is_error)")
    expect(all(r.content for r in out.tool_results if r.is_error), f"{where}: an error result says nothing")
    bounds = s.spec.reward_min <= out.reward <= s.spec.reward_max
    expect(bounds, f"{where}: reward {out.reward} outside the spec's bounds")


def check_tools(s: Suite) -> None:
    s.needs("tools")
    if not s.spec.tools:
        _expect_bad(s, "a call to an env without tools", [_call("c1", "no_such_tool", "{}")])
        return
    schemas = {}
    for tool in s.spec.tools:
        expect(bool(tool.name) and tool.name not in schemas, f"tool names must be set and unique: {tool.name!r}")
        try:
            schemas[tool.name] = json.loads(tool.parameters_json)
        except json.JSONDecodeError as exc:
            raise CheckFailed(f"tool '{tool.name}': parameters_json is not JSON: {exc}") from None
        expect(isinstance(schemas[tool.name], dict), f"tool '{tool.name}': parameters_json is not a JSON object")
    name, schema = next(iter(schemas.items()))
    good = json.dumps(sample_arguments(schema))
    valid = [_call("call-1", name, good)]
    _expect_results(f"a valid call {name}({good})", _first_step(s, valid), valid)
    _expect_bad(s, "a call to an unknown tool", [_call("c1", "no_such_tool_" + uuid.uuid4().hex[:6], "{}")])
    _expect_bad(s, "a call whose arguments are not JSON", [_call("c1", name, "{not json")])
    breaking = breaking_arguments(schema)
    if breaking is not None:
        _expect_bad(s, f"a call {name}({breaking}) failing the schema", [_call("c1", name, breaking)])
    _expect_bad(s, "two calls sharing an id", [_call("same", name, good), _call("same", name, good)])
    text_only = _first_step(s, [], s.spec.example_action)
    _expect_results("a Step with text alone", text_only, [])
    capabilities = set(s.info.capabilities)
    if "batch" in capabilities:
        session = s.t.open()
        episode = s.t.reset(session, 11).episode_id
        request = step_request(session, episode, 0, "")
        request.action.tool_calls.extend(valid)
        (item,) = s.t.call("BatchStep", pb.BatchStepRequest(items=[request])).items
        _expect_results("a valid call over BatchStep", item, valid)
    if "stream" in capabilities:
        session = s.t.open()
        episode = s.t.reset(session, 11).episode_id
        request = step_request(session, episode, 0, "", rid())
        request.action.tool_calls.extend(valid)
        stream = s.t.stub.Stream(
            iter([pb.StreamRequest(tag=1, step=request)]), timeout=s.t.timeout, metadata=s.t.metadata
        )
        (answer,) = list(stream)
        _expect_results("a valid call over the Stream", answer.step, valid)
    s.t.close_opened()
