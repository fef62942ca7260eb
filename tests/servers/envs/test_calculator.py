"""The calculator tool env (issue 32) without a server: safe arithmetic, seeded questions, rewards and limits."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from env_servers import get_env
from env_servers.api import Action, ConfigError, Observation, ToolCall
from env_servers.envs.calculator import CalculatorConfig, CalculatorEnv, evaluate, show


def calc(call_id: str, expression: str) -> ToolCall:
    return ToolCall(call_id, "calculate", json.dumps({"expression": expression}))


def answer(call_id: str, value: float) -> ToolCall:
    return ToolCall(call_id, "answer", json.dumps({"value": value}))


def test_evaluate_is_exact_arithmetic_and_nothing_else() -> None:
    assert evaluate("37 * 12 + 5") == 449 and evaluate("(2 + 3) * -4") == -20
    assert (
        evaluate("7 / 2") == Fraction(7, 2)
        and show(evaluate("7 / 2")) == "3.5"
        and show(evaluate("1/3")) == "0.3333333333"
    )
    assert evaluate("0.1 + 0.2") == Fraction(3, 10)  # exact, not 0.30000000000000004
    refused = [("2 ** 3", "not allowed"), ("x + 1", "not allowed"), ("__import__('os')", "not allowed"),
               ("1 / (2 - 2)", "division by zero"), ("(1", "not an arithmetic"), ("1e999", "finite"),
               ("True + 1", "not allowed"), ("'a' * 3", "not allowed"), ("1" * 201, "longer than")]  # fmt: skip
    for bad, words in refused:
        with pytest.raises(ValueError, match=words):
            evaluate(bad)


def test_the_same_seed_gives_the_same_question_and_the_spec_lists_the_tools() -> None:
    env = CalculatorEnv(CalculatorConfig())
    questions = [env.reset(seed)[0] for seed in range(50)]
    assert questions == [CalculatorEnv(CalculatorConfig()).reset(seed)[0] for seed in range(50)]
    assert len(set(questions)) > 40 and all(q.startswith("What is ") for q in questions)
    spec = get_env("calculator").describe(CalculatorConfig())
    assert [tool.name for tool in spec.tools] == ["calculate", "answer"]
    assert spec.reward_min == -0.1 and spec.reward_max == 1.0 and spec.max_steps == 4


def test_calculate_then_a_correct_answer_ends_the_task_with_reward_one() -> None:
    env = CalculatorEnv(CalculatorConfig())
    _, info = env.reset(7)
    obs, reward, terminated, truncated, info1 = env.step(Action("", (calc("a", info["question"]),)))
    assert isinstance(obs, Observation) and (reward, terminated, truncated) == (0.0, False, False)
    (result,) = obs.tool_results
    assert result.call_id == "a" and not result.is_error and Fraction(result.content) == evaluate(info["question"])
    assert info1["action_valid"] and info1["metrics"]["tool_calls"] == 1.0
    obs, reward, terminated, _, info2 = env.step(Action("", (answer("b", float(result.content)), answer("c", 1))))
    assert (reward, terminated, info2["metrics"]["success"]) == (1.0, True, 1.0)
    assert [r.content for r in obs.tool_results] == ["correct", "not run: the task is already answered"]
    assert obs.tool_results[1].is_error


def test_a_wrong_answer_goes_on_and_a_reply_without_calls_is_invalid() -> None:
    env = CalculatorEnv(CalculatorConfig(max_steps=3, format_penalty=-0.5))
    env.reset(1)
    assert env.bad_call_penalty == -0.5
    obs, reward, terminated, truncated, info = env.step(Action("", (answer("a", -1),)))
    assert (reward, terminated, truncated) == (0.0, False, False) and "not the answer" in obs.tool_results[0].content
    obs, reward, terminated, truncated, info = env.step("the answer is 4")  # text alone (also as an Action)
    assert (reward, terminated, truncated, info["action_valid"]) == (-0.5, False, False, False)
    assert obs.tool_results == () and "Reply with tool calls" in obs.text
    obs, reward, terminated, truncated, _ = env.step(Action("", (calc("e", "2 ** 8"),)))  # a tool error: still valid
    assert obs.tool_results[0].is_error and "not allowed" in obs.tool_results[0].content
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_the_config_is_checked() -> None:
    entry = get_env("calculator")
    assert entry.make_config({"max_steps": 2}).max_steps == 2
    for bad, key in [({"max_steps": 0}, "max_steps"), ({"max_operand": 1}, "max_operand"),
                     ({"format_penalty": 0.5}, "format_penalty"), ({"nope": 1}, "nope")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            entry.make_config(bad)
