"""The calculator tool env: an arithmetic question per seed, answered with ``calculate`` and ``answer`` tool
calls (rules in docs/envs.md)."""

from __future__ import annotations

import ast
import json
import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from env_servers.api import Action, EnvSpec, Observation, Tool, ToolResult
from env_servers.envs.tool_task import tool_turn
from env_servers.registry import register

MAX_EXPRESSION = 200  # characters; with no powers, values stay a few hundred digits
HINT = "calculate(expression) or answer(value)"
METRICS = ("action_valid", "success", "tool_calls")
_FORMS = ("{a} * {b} + {c}", "{a} * {b} - {c}", "({a} + {b}) * {c}", "{a} + {b} * {c}", "({a} - {b}) * {c}")
_OPERATORS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y}

TOOLS = (
    Tool(
        "calculate",
        "Evaluate an arithmetic expression: numbers, + - * / and parentheses.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (37 + 5) * 12"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    ),
    Tool(
        "answer",
        "Give the final answer to the question; a correct one ends the task.",
        {
            "type": "object",
            "properties": {"value": {"type": "number", "description": "the value of the question's expression"}},
            "required": ["value"],
            "additionalProperties": False,
        },
    ),
)


@dataclass(frozen=True)
class CalculatorConfig:
    max_steps: int = field(default=4, metadata={"doc": "turns before the episode is truncated; invalid replies count"})
    format_penalty: float = field(
        default=-0.1, metadata={"doc": "reward of a reply without a tool call, or with a bad call"}
    )
    max_operand: int = field(default=50, metadata={"doc": "the question's numbers are drawn from 2..max_operand"})

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.max_operand < 2:
            raise ValueError(f"max_operand must be >= 2, got {self.max_operand}")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty must be <= 0, got {self.format_penalty}")


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression, without ``eval``; ValueError for anything else."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ValueError(f"{node.value} is not a finite number")
        return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _value(node.left), _value(node.right)
        if right == 0:
            raise ValueError("division by zero")
        return left / right
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(f"'{ast.unparse(node)}' is not allowed (numbers, + - * / and parentheses only)")


def show(value: Fraction) -> str:
    """An integer as itself, else up to 10 significant digits."""
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.10g}"


@register("calculator", CalculatorConfig)
class CalculatorEnv:
    """Answer an arithmetic question with the calculate and answer tools."""

    forkable = True

    def __init__(self, config: CalculatorConfig) -> None:
        self.config = config
        self.bad_call_penalty = config.format_penalty
        self.question, self.target, self.t, self.done = "", Fraction(0), 0, False

    @classmethod
    def describe(cls, config: CalculatorConfig) -> EnvSpec:
        return EnvSpec(
            env_id="calculator",
            version="1",
            instruction="Answer the arithmetic question. Act only through tool calls: `calculate` evaluates an "
            "expression, `answer` gives your final value (a correct answer ends the task).",
            action_format=f"one or more tool calls: {HINT}",
            example_action='calculate({"expression": "37 * 12 + 5"})',
            max_steps=config.max_steps,
            reward_min=config.format_penalty,
            reward_max=1.0,
            metrics=METRICS,
            tools=TOOLS,
        )

    def reset(self, seed: int, options: Any = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        a, b, c = (rng.randint(2, self.config.max_operand) for _ in range(3))
        self.question = rng.choice(_FORMS).format(a=a, b=b, c=c)
        self.target, self.t, self.done = evaluate(self.question), 0, False
        return f"What is {self.question}?", {"question": self.question}

    def step(self, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
        action = Action(action) if isinstance(action, str) else action
        self.t += 1
        results = tuple(self._run(call.id, call.name, call.arguments) for call in action.tool_calls)
        valid = bool(action.tool_calls)
        reward, truncated, text = tool_turn(
            valid, self.done, self.t, self.config.max_steps, self.config.format_penalty, HINT
        )
        metrics = {"action_valid": float(valid), "success": float(self.done), "tool_calls": float(len(results))}
        info = {"action_valid": valid, "metrics": metrics}
        return Observation(text, tool_results=results), reward, self.done, truncated, info

    def _run(self, call_id: str, name: str, arguments: str) -> ToolResult:
        if self.done:
            return ToolResult(call_id, name, "not run: the task is already answered", is_error=True)
        try:  # the runtime checked these; unit tests call directly
            args = json.loads(arguments)
            if name == "calculate":
                return ToolResult(call_id, name, show(evaluate(str(args["expression"]))))
            if name != "answer":
                raise ValueError(f"unknown tool '{name}'")
            given = Fraction(str(float(args["value"])))
        except (ValueError, KeyError, TypeError) as exc:
            return ToolResult(call_id, name, f"error: {exc}", is_error=True)
        self.done = abs(given - self.target) < Fraction(1, 10**6)
        return ToolResult(call_id, name, "correct" if self.done else f"{show(given)} is not the answer")
