"""Tool calls in a Step (env.proto, "Tools"): checked before the env sees them, its results checked after.

A bad call gets an error result here and never reaches the env, which is still stepped with the text and the
good calls; the step is then ``action_valid=False`` with the bad-call penalty, whatever the good calls earned
(docs/writing-an-env.md).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from env_servers.api import EnvSpec, Observation, Tool, ToolCall, ToolResult
from env_servers.tool_schema import schema_error
from roll_lightning.protocol.v1 import env_pb2 as pb


class ToolRuleBroken(ValueError):
    """An env's tool results are not one per call given, with its id, in order; never sent."""


def tool_to_proto(tool: Tool) -> pb.Tool:
    return pb.Tool(
        name=tool.name, description=tool.description, parameters_json=json.dumps(dict(tool.parameters), sort_keys=True)
    )


@dataclass(frozen=True)
class ToolBox:
    """One env's tools by name, checked once per session."""

    tools: Mapping[str, Tool]

    @classmethod
    def of(cls, spec: EnvSpec) -> ToolBox | None:
        """The spec's tools (None for a text env); ValueError if they cannot be served."""
        if not spec.tools:
            return None
        tools: dict[str, Tool] = {}
        for tool in spec.tools:
            if not isinstance(tool, Tool) or not tool.name or tool.name in tools:
                raise ValueError(f"EnvSpec.tools: {tool!r} is not a Tool with a non-empty, unique name")
            if not isinstance(tool.parameters, Mapping):
                raise ValueError(f"EnvSpec.tools: the parameters of '{tool.name}' must be a JSON Schema object")
            json.dumps(dict(tool.parameters))  # raises if not JSON
            tools[tool.name] = tool
        return cls(tools)

    def problem(self, call: pb.ToolCall) -> str | None:
        """What is wrong with one call, ids aside, or None."""
        tool = self.tools.get(call.name)
        if tool is None:
            return f"unknown tool '{call.name}' (tools: {', '.join(self.tools)})"
        try:
            arguments = json.loads(call.arguments_json)
        except (json.JSONDecodeError, RecursionError) as exc:
            return f"the arguments of '{call.name}' are not JSON: {exc}"
        if not isinstance(arguments, dict):
            return f"the arguments of '{call.name}' must be a JSON object, got {type(arguments).__name__}"
        error = schema_error(tool.parameters, arguments)
        return None if error is None else f"the arguments of '{call.name}' break its schema: {error}"


def check_calls(calls: Sequence[pb.ToolCall], box: ToolBox | None) -> tuple[list[ToolCall], list[pb.ToolResult | None]]:
    """The good calls, and per call the runtime's error result (None: good)."""
    counts = Counter(call.id for call in calls)
    good: list[ToolCall] = []
    errors: list[pb.ToolResult | None] = []
    for call in calls:
        if not call.id:
            problem = "the call has no id (ids are chosen by the client, unique within the step)"
        elif counts[call.id] > 1:
            problem = f"call id '{call.id}' is used by {counts[call.id]} calls in this step (ids must be unique)"
        elif box is None:
            problem = f"this env has no tools (unknown tool '{call.name}')"
        else:
            problem = box.problem(call)
        if problem is None:
            good.append(ToolCall(call.id, call.name, call.arguments_json))
            errors.append(None)
        else:
            errors.append(pb.ToolResult(call_id=call.id, name=call.name, content=problem, is_error=True))
    return good, errors


def merge_results(obs: Any, good: list[ToolCall], errors: list[pb.ToolResult | None]) -> list[pb.ToolResult]:
    """The step's results in call order: the env's for good calls, the runtime's for bad ones."""
    given = obs.tool_results if isinstance(obs, Observation) else ()
    if len(given) != len(good):
        raise ToolRuleBroken(f"the env was given {len(good)} tool calls and returned {len(given)} results (one each)")
    out, k = [], 0
    for error in errors:
        if error is not None:
            out.append(error)
            continue
        call, result = good[k], given[k]
        k += 1
        if not isinstance(result, ToolResult) or result.call_id != call.id or not isinstance(result.content, str):
            raise ToolRuleBroken(f"result {result!r} must be a ToolResult with call_id '{call.id}' and str content")
        out.append(
            pb.ToolResult(
                call_id=call.id, name=result.name or call.name, content=result.content, is_error=bool(result.is_error)
            )
        )
    return out


def bad_call_penalty(env: Any, spec: EnvSpec) -> float:
    """The env's ``bad_call_penalty``, else its spec's ``reward_min``."""
    penalty = getattr(env, "bad_call_penalty", None)
    return float(spec.reward_min if penalty is None else penalty)
