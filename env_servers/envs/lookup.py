"""The lookup tool env: ``lookup(box)`` reads a box's two-digit code, ``answer(code)`` gives it (reward 1).

The smallest task that needs a tool's result: guessing succeeds 1 time in 90. Rules: docs/envs.md.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import Action, EnvSpec, Observation, Tool, ToolResult
from env_servers.envs.tool_task import tool_turn
from env_servers.registry import register

HINT = "lookup(box) or answer(code)"
METRICS = ("action_valid", "success", "tool_calls", "lookups")


def _integer(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "integer", "description": description}},
        "required": [name],
        "additionalProperties": False,
    }


TOOLS = (
    Tool("lookup", "Read the code in a box.", _integer("box", "the box's number")),
    Tool("answer", "Give the code you were asked for; the right one ends the task.", _integer("code", "the code")),
)


@dataclass(frozen=True)
class LookupConfig:
    max_steps: int = field(default=3, metadata={"doc": "turns before the episode is truncated; invalid replies count"})
    boxes: int = field(default=9, metadata={"doc": "boxes numbered 1..boxes, each with a code from 10 to 99"})
    format_penalty: float = field(
        default=-0.1, metadata={"doc": "reward of a reply without a tool call, or with a bad call"}
    )

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not 1 <= self.boxes <= 99:
            raise ValueError(f"boxes must be in 1..99, got {self.boxes}")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty must be <= 0, got {self.format_penalty}")


@register("lookup", LookupConfig)
class LookupEnv:
    """Look up a box's code, then answer with it."""

    forkable = True

    def __init__(self, config: LookupConfig) -> None:
        self.config = config
        self.bad_call_penalty = config.format_penalty
        self.codes: list[int] = []
        self.box, self.t, self.done = 0, 0, False

    @classmethod
    def describe(cls, config: LookupConfig) -> EnvSpec:
        return EnvSpec(
            env_id="lookup",
            version="1",
            instruction="Find the code you are asked for: `lookup` reads a box, `answer` gives the code.",
            action_format=f"one or more tool calls: {HINT}",
            example_action='lookup({"box": 3})',
            max_steps=config.max_steps,
            reward_min=config.format_penalty,
            reward_max=1.0,
            metrics=METRICS,
            tools=TOOLS,
        )

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        self.codes = [rng.randint(10, 99) for _ in range(self.config.boxes)]
        self.box, self.t, self.done = rng.randint(1, self.config.boxes), 0, False
        return f"What is the code of box {self.box}?", {"box": self.box, "code": self.codes[self.box - 1]}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        action = Action(action) if isinstance(action, str) else action
        self.t += 1
        results = tuple(self._run(call.id, call.name, call.arguments) for call in action.tool_calls)
        valid = bool(action.tool_calls)
        reward, truncated, text = tool_turn(
            valid, self.done, self.t, self.config.max_steps, self.config.format_penalty, HINT
        )
        lookups = sum(call.name == "lookup" for call in action.tool_calls)
        metrics = {"action_valid": float(valid), "success": float(self.done), "tool_calls": float(len(results)),
                   "lookups": float(lookups)}  # fmt: skip
        return (
            Observation(text, tool_results=results),
            reward,
            self.done,
            truncated,
            {"action_valid": valid, "metrics": metrics},
        )

    def _run(self, call_id: str, name: str, arguments: str) -> ToolResult:
        if self.done:
            return ToolResult(call_id, name, "not run: the task is already answered", is_error=True)
        if name not in ("lookup", "answer"):
            return ToolResult(call_id, name, f"error: unknown tool '{name}'", is_error=True)
        try:  # the runtime checked these; unit tests call directly
            value = int(json.loads(arguments)["box" if name == "lookup" else "code"])
        except (ValueError, KeyError, TypeError) as exc:
            return ToolResult(call_id, name, f"error: {exc}", is_error=True)
        if name == "lookup":
            if not 1 <= value <= self.config.boxes:
                return ToolResult(call_id, name, f"error: boxes are numbered 1 to {self.config.boxes}", is_error=True)
            return ToolResult(call_id, name, str(self.codes[value - 1]))
        self.done = value == self.codes[self.box - 1]
        return ToolResult(call_id, name, "correct" if self.done else f"{value} is not the code")
