"""WebShop's tools interface (``interface: "tools"``, issue 32): the spec's tools, tool calls that do what the text
actions do (same pages, same reward), invalid calls, the calls-per-step limit, the text mode unchanged, and the
tools mode through a real server, the client and the conformance suite."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator

import pytest
from support.conformance import conforms
from support.servers import start_server

from env_servers.api import Action, ConfigError, Observation, ToolCall, parse_config
from env_servers.envs.webshop import WebShopConfig, WebShopEnv
from env_servers.envs.webshop.tools import TOOLS
from env_servers.server import RunningServer
from env_servers.tool_schema import schema_error
from roll_lightning.env_client import ClientToolCall, EnvPool

TOOLS_CONFIG = WebShopConfig(interface="tools")
# sha256 of a scripted text-mode episode and the text-mode spec, computed before the tools interface existed.
TEXT_MODE_DIGEST = "63728474e4b47b882a80eafb58ebf089abc903fc86107bcbcb16717d6b85ee05"


def calls(*pairs: tuple[str, str]) -> Action:
    key = {"search": "query", "click": "target"}
    return Action(
        "", tuple(ToolCall(str(i), name, json.dumps({key[name]: arg})) for i, (name, arg) in enumerate(pairs))
    )


def body(page: str) -> str:
    """A page without its last line (the available actions, in text or call syntax)."""
    head, _, tail = page.rpartition("\nAvailable actions: ")
    assert head and tail
    return head


def test_the_spec_lists_the_tools_with_schemas():
    spec = WebShopEnv.describe(TOOLS_CONFIG)
    assert [t.name for t in spec.tools] == ["search", "click"] and spec.tools == TOOLS
    assert spec.tools[0].parameters["required"] == ["query"] and spec.tools[1].parameters["required"] == ["target"]
    assert schema_error(spec.tools[0].parameters, {"query": "tea"}) is None
    assert schema_error(spec.tools[1].parameters, {"query": "tea"}) is not None
    assert "search(query)" in spec.instruction and "search[" not in spec.instruction
    assert "click(target)" in spec.action_format and json.loads(spec.example_action.split("(", 1)[1][:-1])
    assert spec.metrics[-1] == "tool_calls" and spec.reward_min == TOOLS_CONFIG.format_penalty
    text = WebShopEnv.describe(WebShopConfig())
    assert not text.tools and "search[" in text.instruction and text.metrics[-1] != "tool_calls"
    assert dataclasses.replace(spec, instruction="", action_format="", example_action="", metrics=(), tools=()) == (
        dataclasses.replace(text, instruction="", action_format="", example_action="", metrics=())
    )


def test_config_checks_the_interface():
    assert parse_config(WebShopConfig, {"interface": "tools", "max_calls_per_step": 2.0}, env_id="webshop") == (
        WebShopConfig(interface="tools", max_calls_per_step=2)
    )
    with pytest.raises(ConfigError, match="interface"):
        parse_config(WebShopConfig, {"interface": "html"}, env_id="webshop")
    with pytest.raises(ConfigError, match="max_calls_per_step"):
        parse_config(WebShopConfig, {"max_calls_per_step": 0}, env_id="webshop")


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_calls_do_what_the_text_actions_do(seed):
    text, tools = WebShopEnv(WebShopConfig()), WebShopEnv(TOOLS_CONFIG)
    text_obs, text_info = text.reset(seed)
    tools_obs, tools_info = tools.reset(seed)
    assert tools_info == text_info and body(tools_obs) == body(text_obs)
    assert tools_obs.endswith("Available actions: search(query)")
    steps = [("search", text_info["instruction"][:60])]
    for _ in range(6):
        kind, arg = steps[-1]
        expected = text.step(f"{kind}[{arg}]")
        obs, reward, terminated, truncated, info = tools.step(calls((kind, arg)))
        assert isinstance(obs, Observation) and body(obs.text) == body(expected[0])
        assert (reward, terminated, truncated) == expected[1:4]
        assert {k: v for k, v in info.items() if k != "metrics"} == {
            k: v for k, v in expected[4].items() if k != "metrics"
        }
        assert info["metrics"] == {**expected[4]["metrics"], "tool_calls": 1.0}
        (result,) = obs.tool_results
        assert result.call_id == "0" and result.name == kind and not result.is_error and result.content
        if terminated:
            assert result.content.startswith("bought ") and reward == expected[1] and info["purchased_asin"]
            break
        clickables = tools.clickables()
        assert obs.text.endswith(f"click(target) with target one of {json.dumps(clickables)}")
        # results -> first product; item -> an option, then buy now
        if info["page"] == "results":
            steps.append(("click", clickables[-1]))
        elif info["page"] == "item" and kind == "click" and arg not in ("buy now",) and len(steps) < 3:
            options = clickables[2:-4]
            steps.append(("click", options[0] if options else "buy now"))
        else:
            steps.append(("click", "buy now"))
    else:
        pytest.fail("the script did not buy")


def test_a_search_result_says_what_it_did():
    env = WebShopEnv(TOOLS_CONFIG)
    env.reset(5)
    obs, *_ = env.step(calls(("search", "  Green TEA ")))
    assert obs.tool_results[0].content.startswith("searched for 'green tea': ")
    obs, *_ = env.step(calls(("click", env.clickables()[-1])))
    assert obs.tool_results[0].content.startswith("opened B")
    obs, *_ = env.step(calls(("click", "reviews")))
    assert obs.tool_results[0].content == "opened reviews"
    obs, *_ = env.step(calls(("click", "back to search")))
    assert obs.tool_results[0].content == "back on the search page"


def test_a_call_not_on_the_page_is_an_invalid_step_with_an_error_result():
    env = WebShopEnv(TOOLS_CONFIG)
    start, _ = env.reset(1)
    penalty = TOOLS_CONFIG.format_penalty
    for action, words in [
        (calls(("click", "buy now")), "'buy now' is not clickable"),
        (calls(("search", "   ")), "the query is empty"),
        (Action("", (ToolCall("x", "jump", "{}"),)), "unknown tool 'jump'"),
        (Action("", (ToolCall("x", "search", '{"q": 1}'),)), "string 'query'"),
        (Action("", (ToolCall("x", "click", "not json"),)), "JSON object"),
    ]:
        obs, reward, terminated, truncated, info = env.step(action)
        (result,) = obs.tool_results
        assert result.is_error and words in result.content and result.call_id == action.tool_calls[0].id
        assert obs.text == start and reward == penalty and not terminated and info["action_valid"] is False
    env.step(calls(("search", "tea")))
    obs, reward, *_, info = env.step(calls(("search", "coffee")))
    assert "cannot search (this is the results page" in obs.tool_results[0].content and reward == penalty
    obs, reward, *_, info = env.step("search[tea]")  # a reply without a call (text actions are not read)
    assert obs.tool_results == () and reward == penalty and not info["action_valid"] and info["page"] == "results"


def test_calls_per_step_limit_and_calls_after_a_purchase():
    env = WebShopEnv(TOOLS_CONFIG)
    env.reset(2)
    obs, reward, *_, info = env.step(calls(("search", "tea"), ("click", "next >")))
    assert [r.is_error for r in obs.tool_results] == [False, True] and "at most 1 call" in obs.tool_results[1].content
    assert reward == TOOLS_CONFIG.format_penalty and info["page"] == "results" and "Page 1 " in obs.text
    env = WebShopEnv(WebShopConfig(interface="tools", max_calls_per_step=4))
    assert "up to 4 tool calls per reply" in WebShopEnv.describe(env.config).action_format
    env.reset(2)
    env.step(calls(("search", "tea"), ("click", "next >")))
    assert "Page 2 " in env._render()
    target = env.clickables()[-1]
    obs, reward, terminated, _, info = env.step(calls(("click", target), ("click", "buy now"), ("click", "buy now")))
    assert (
        terminated
        and info["action_valid"]
        and reward == info["metrics"]["score"]
        and info["metrics"]["tool_calls"] == 3
    )
    assert [r.is_error for r in obs.tool_results] == [False, False, True] and "episode" in obs.tool_results[2].content
    env.reset(2)  # an invalid call then a purchase: the step is invalid, and scores the penalty
    env.step(calls(("search", "tea")))
    obs, reward, terminated, *_ = env.step(
        calls(("click", "nope"), ("click", env.clickables()[-1]), ("click", "buy now"))
    )
    assert terminated and reward == TOOLS_CONFIG.format_penalty


def text_episode_digest() -> str:
    env = WebShopEnv(WebShopConfig(max_steps=8))
    spec = WebShopEnv.describe(env.config)
    out: list = [spec.instruction, spec.action_format, spec.example_action, list(spec.metrics), spec.reward_min]
    for seed in (0, 3):
        out.append(env.reset(seed))
        for action in ["click[x]", "search[blue shoes]", "click[next >]", "<answer>click[< prev]</answer>", "jump"]:
            out.append(env.step(action))
        out.append(env.step(f"click[{env.clickables()[-1]}]"))
        out.append(env.step(f"click[{env.clickables()[2]}]"))
        out.append(env.step("click[buy now]"))
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def test_text_mode_is_unchanged():
    assert text_episode_digest() == TEXT_MODE_DIGEST
    assert not hasattr(WebShopEnv(WebShopConfig()), "bad_call_penalty")


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(env_ids=("webshop",), max_sessions=20, session_ttl_s=5)
    yield server
    server.stop()


async def test_tool_calls_through_a_server_and_the_client(running):
    local = WebShopEnv(TOOLS_CONFIG)
    local_obs, _ = local.reset(9)
    async with EnvPool([running.address], transport="unary") as pool:
        session = await pool.open("webshop", {"interface": "tools"})
        assert [t.name for t in session.tools] == ["search", "click"]
        first = await session.reset(seed=9)
        assert first.observation == local_obs
        out = await session.step("", [ClientToolCall("s1", "search", json.dumps({"query": "tea"}))])
        obs, reward, *_ = local.step(calls(("search", "tea")))
        assert out.observation == obs.text and out.reward == reward and out.action_valid
        assert [(r.call_id, r.content, r.is_error) for r in out.tool_results] == [
            ("s1", obs.tool_results[0].content, False)
        ]
        out = await session.step("", [ClientToolCall("c1", "click", json.dumps({"target": "nowhere"}))])
        assert out.tool_results[0].is_error and "not clickable" in out.tool_results[0].content
        assert out.reward == TOOLS_CONFIG.format_penalty and out.observation == obs.text and not out.action_valid
        out = await session.step("", [ClientToolCall("c2", "click", json.dumps({"place": "x"}))])  # the runtime's check
        assert out.tool_results[0].is_error and out.reward == TOOLS_CONFIG.format_penalty and not out.action_valid


def test_conformance_passes_with_tools(running):
    second = start_server(env_ids=("webshop",), max_sessions=20, session_ttl_s=2)
    try:
        conforms(running.address, "webshop", config={"interface": "tools"}, second=second.address, passed=["tools"])
    finally:
        second.stop()
