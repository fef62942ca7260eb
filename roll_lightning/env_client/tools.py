"""Tool calls on the client's side (env.proto, "Tools"): the env's tools, a reply's calls, their results."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll_lightning.protocol.v1 import env_pb2 as pb


@dataclass(frozen=True)
class ClientTool:
    """``parameters``: the arguments' JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @classmethod
    def from_proto(cls, tool: pb.Tool) -> ClientTool:
        parameters = json.loads(tool.parameters_json) if tool.parameters_json else {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ValueError(f"tool '{tool.name}': parameters_json is not a JSON object")
        return cls(tool.name, tool.description, parameters)

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ClientToolCall:
    """``id``: unique within the step; ``arguments``: the model's JSON text, which the server judges."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ClientToolResult:
    """``is_error``: a bad call, or the tool's own failure."""

    call_id: str
    name: str
    content: str
    is_error: bool = False


def tools_in(spec: pb.EnvSpec) -> tuple[ClientTool, ...]:
    """ValueError for a schema that is not a JSON object."""
    return tuple(ClientTool.from_proto(tool) for tool in spec.tools)


def tools_of(spec: pb.EnvSpec | Iterable[ClientTool]) -> list[dict[str, Any]]:
    """The tools as OpenAI-style dicts, for ``apply_chat_template(tools=...)``."""
    tools = tools_in(spec) if isinstance(spec, pb.EnvSpec) else tuple(spec)
    return [tool.as_openai() for tool in tools]


def fill_calls(action: pb.Action, calls: Sequence[ClientToolCall]) -> None:
    action.tool_calls.extend(pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments) for c in calls)


def check_results(calls: Sequence[ClientToolCall], results: Sequence[pb.ToolResult]) -> str | None:
    """How the results break the rule (one per call, with its id, in call order), or None."""
    if len(results) != len(calls):
        return f"the step made {len(calls)} tool calls but the answer carries {len(results)} tool results"
    for i, (call, result) in enumerate(zip(calls, results, strict=True)):
        if result.call_id != call.id:
            return f"tool result {i} names call_id {result.call_id!r}, but call {i} has id {call.id!r}"
    return None


def results_of(results: Sequence[pb.ToolResult]) -> tuple[ClientToolResult, ...]:
    return tuple(ClientToolResult(r.call_id, r.name, r.content, r.is_error) for r in results)
