"""The lookup tool env without a server: seeded questions, the code only through `lookup`, rewards and limits."""

from __future__ import annotations

import json

import pytest

from env_servers import get_env
from env_servers.api import Action, ConfigError, Observation, ToolCall
from env_servers.envs.lookup import LookupConfig, LookupEnv


def lookup(call_id: str, box: int) -> ToolCall:
    return ToolCall(call_id, "lookup", json.dumps({"box": box}))


def answer(call_id: str, code: int) -> ToolCall:
    return ToolCall(call_id, "answer", json.dumps({"code": code}))


def test_the_same_seed_gives_the_same_boxes_and_the_spec_lists_the_tools() -> None:
    env = LookupEnv(LookupConfig())
    questions = [env.reset(seed) for seed in range(50)]
    assert questions == [LookupEnv(LookupConfig()).reset(seed) for seed in range(50)]
    assert {q for q, _ in questions} == {f"What is the code of box {k}?" for k in range(1, 10)}
    assert all(10 <= info["code"] <= 99 and str(info["code"]) not in q for q, info in questions)
    spec = get_env("lookup").describe(LookupConfig())
    assert [tool.name for tool in spec.tools] == ["lookup", "answer"]
    assert spec.reward_min == -0.1 and spec.reward_max == 1.0 and spec.max_steps == 3


def test_lookup_then_the_right_code_ends_the_task_with_reward_one() -> None:
    env = LookupEnv(LookupConfig())
    _, info = env.reset(7)
    obs, reward, terminated, truncated, info1 = env.step(Action("", (lookup("a", info["box"]),)))
    assert isinstance(obs, Observation) and (reward, terminated, truncated) == (0.0, False, False)
    (result,) = obs.tool_results
    assert (result.call_id, result.content, result.is_error) == ("a", str(info["code"]), False)
    assert info1["action_valid"] and info1["metrics"]["lookups"] == 1.0 and obs.text == "2 turns left."
    obs, reward, terminated, _, info2 = env.step(Action("", (answer("b", int(result.content)), answer("c", 1))))
    assert (reward, terminated, info2["metrics"]["success"]) == (1.0, True, 1.0)
    assert [r.content for r in obs.tool_results] == ["correct", "not run: the task is already answered"]


def test_a_wrong_code_goes_on_a_missing_box_is_an_error_and_text_is_invalid() -> None:
    env = LookupEnv(LookupConfig(max_steps=3, boxes=5, format_penalty=-0.5))
    _, info = env.reset(1)
    wrong = 10 if info["code"] != 10 else 11
    obs, reward, terminated, truncated, _ = env.step(Action("", (answer("a", wrong),)))
    assert (reward, terminated, truncated) == (0.0, False, False) and obs.tool_results[
        0
    ].content == f"{wrong} is not the code"
    obs, reward, terminated, truncated, info1 = env.step("the code is 42")
    assert (reward, terminated, truncated, info1["action_valid"]) == (-0.5, False, False, False)
    assert obs.tool_results == () and "Reply with tool calls" in obs.text
    obs, reward, terminated, truncated, _ = env.step(Action("", (lookup("b", 6), ToolCall("c", "open", "{}"))))
    assert [r.is_error for r in obs.tool_results] == [True, True] and "numbered 1 to 5" in obs.tool_results[0].content
    assert (reward, terminated, truncated) == (0.0, False, True)


def test_the_config_is_checked() -> None:
    entry = get_env("lookup")
    assert entry.make_config({"boxes": 20}).boxes == 20
    for bad, key in [({"max_steps": 0}, "max_steps"), ({"boxes": 0}, "boxes"), ({"boxes": 100}, "boxes"),
                     ({"format_penalty": 0.5}, "format_penalty"), ({"nope": 1}, "nope")]:  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            entry.make_config(bad)
