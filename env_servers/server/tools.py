"""Tool calls in a Step (env.proto, "Tools"): the runtime's checks before the env sees a call, and the rule its
results must keep.

The rule for a step with bad calls (an unknown tool, arguments that are not a JSON object or fail the tool's
schema, an empty id or one shared by several calls): each bad call is answered here with an error result
naming what was wrong, and the env never sees it. The env is still stepped, with the text and the good calls
only (possibly none), so its turn count, state and limits move as for any step, and its results for the good
calls stand. The step is then ``action_valid=False`` and its reward is the env's penalty for a bad call: its
``bad_call_penalty`` attribute when it has one, else the spec's ``reward_min``, whatever the good calls earned
(a reply cannot buy its way out of a bad call). ``terminated``/``truncated`` stay the env's.
A text env (no tools) given calls is stepped with the text as always, and every call is bad.
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
    """An env's tool results break the rule (one per call it was given, with its id, in order); never sent."""


def tool_to_proto(tool: Tool) -> pb.Tool:
    return pb.Tool(
        name=tool.name, description=tool.description, parameters_json=json.dumps(dict(tool.parameters), sort_keys=True)
    )


@dataclass(frozen=True)
class ToolBox:
    """The tools of one env (name -> Tool), checked once when the session starts."""

    tools: Mapping[str, Tool]

    @classmethod
    def of(cls, spec: EnvSpec) -> ToolBox | None:
        """The spec's tools (None for a text env); raises ValueError for a spec that cannot be served."""
        if not spec.tools:
            return None
        tools: dict[str, Tool] = {}
        for tool in spec.tools:
            if not isinstance(tool, Tool) or not tool.name or tool.name in tools:
                raise ValueError(f"EnvSpec.tools: {tool!r} is not a Tool with a non-empty, unique name")
            if not isinstance(tool.parameters, Mapping):
                raise ValueError(f"EnvSpec.tools: the parameters of '{tool.name}' must be a JSON Schema object")
            json.dumps(dict(tool.parameters))  # the schema travels as JSON text
            tools[tool.name] = tool
        return cls(tools)

    def problem(self, call: pb.ToolCall) -> str | None:
        """What is wrong with one call in itself (not its id), or None."""
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
    """The good calls (as the env sees them) and, per call in order, the runtime's error result (None: good)."""
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
    """The step's results in call order: the env's for the good calls, the runtime's for the bad ones.

    Raises ToolRuleBroken when the env did not answer exactly the calls it was given, in order, with their ids.
    """
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
    """The reward of a step with a bad call: the env's ``bad_call_penalty``, else its spec's ``reward_min``."""
    penalty = getattr(env, "bad_call_penalty", None)
    return float(spec.reward_min if penalty is None else penalty)
