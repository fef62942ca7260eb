"""Tool calls through the episode bookkeeping: a real calculator env server, the tiny model's tokenizer (its chat
template renders tools as Qwen2.5's does), and replies written as a model would write them (token ids given as
data, so the calls are known): the calls reach the env, the results come back as ``tool`` messages, the
conversation's ids stay the ones the template renders, and the batch counts the calls."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.servers import start_server

from env_servers.server import RunningServer
from roll_lightning.env_client import EnvPool
from roll_lightning.rollout import EpisodeSettings
from roll_lightning.rollout.engines import SamplingParams
from roll_lightning.rollout.engines.base import Generation
from roll_lightning.rollout.episodes.episode import Episode, EpisodeBuilder, ToolHistoryError
from roll_lightning.rollout.prompts.chat import PromptConfig, render
from roll_lightning.rollout.scheduling.metrics import tool_metrics


@pytest.fixture(scope="module")
def calculator_server() -> Iterator[RunningServer]:
    running = start_server(env_ids=("calculator",))
    yield running
    running.stop()


@pytest.fixture
async def pool(calculator_server: RunningServer) -> AsyncIterator[EnvPool]:
    async with EnvPool([calculator_server.address], health_interval_s=0.2) as p:
        yield p


CALCULATE = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "%s"}}\n</tool_call>'
ANSWER = '<tool_call>\n{"name": "answer", "arguments": {"value": %s}}\n</tool_call>'


def reply(tokenizer: Any, text: str) -> Generation:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return Generation(ids, [-1.0] * len(ids), "stop", 0)


async def play(pool: EnvPool, tokenizer: Any, layout: str, replies: list[str]) -> tuple[EpisodeBuilder, list]:
    """One calculator episode (seed 7) with these replies; the builder and the prompts the engine was given."""
    settings = EpisodeSettings(
        layout=layout,  # type: ignore[arg-type]
        max_turns=4,
        max_context_tokens=4096,
        sampling=SamplingParams(max_new_tokens=64),
        prompt=PromptConfig(history_turns=2),
    )
    session = await pool.open("calculator", {})
    try:
        builder = EpisodeBuilder(
            tokenizer, settings, session.spec, Episode(0, 0, 7, "calculator"), {tokenizer.eos_token_id}
        )
        builder.start(await session.reset(seed=7))
        prompts = []
        for text in replies:
            request = builder.next_request()
            if request is None:
                break
            prompts.append(request[0])
            action = builder.record_reply(reply(tokenizer, text), 0.0)
            builder.record_step(await session.step(action, builder.calls), 0.0)
        return builder, prompts
    finally:
        await session.close()


def question(builder: EpisodeBuilder) -> str:
    return builder.episode.turns[0].observation.split("What is ")[1].split("?")[0]


@pytest.mark.parametrize("layout", ["trajectory", "step"])
async def test_calls_reach_the_env_and_their_results_come_back_as_tool_messages(
    pool: EnvPool, tokenizer: Any, layout: str
) -> None:
    probe, _ = await play(pool, tokenizer, layout, ["thinking"])  # learn the question of seed 7
    expression = question(probe)
    value = eval(expression, {"__builtins__": {}})  # the question's own arithmetic (digits and + - * only)
    builder, prompts = await play(pool, tokenizer, layout, [CALCULATE % expression, ANSWER % value])
    first, second = builder.episode.turns
    assert [c.name for c in first.tool_calls] == ["calculate"] and first.tool_calls[0].id == "call_0_0"
    assert [(r.call_id, r.is_error) for r in first.tool_results] == [("call_0_0", False)]
    assert str(value) in first.tool_results[0].content
    assert builder.episode.end_reason == "terminated" and second.reward == 1.0

    # the second prompt shows the tools (rendered by the template) and the result as a <tool_response> turn
    tools = builder.tools
    assert [t["function"]["name"] for t in tools] == ["calculate", "answer"]
    shown = tokenizer.decode(prompts[1], skip_special_tokens=False)
    assert "# Tools" in shown and json.dumps(tools[0]) in shown
    assert f"<tool_response>\n{first.tool_results[0].content}\n</tool_response>" in shown
    if layout == "trajectory":  # appended ids are exactly the template's rendering of the conversation
        text = render(tokenizer, builder.history.messages[:-1], generation_prompt=True, tools=tools)
        assert shown == text


async def test_bad_calls_are_counted_and_shown_back_as_errors(pool: EnvPool, tokenizer: Any) -> None:
    builder, _ = await play(pool, tokenizer, "trajectory", ['<tool_call>{"name": "sqrt", "arguments": {}}</tool_call>'])
    (turn,) = builder.episode.turns
    assert not turn.action_valid and [r.is_error for r in turn.tool_results] == [True]
    metrics = tool_metrics([builder.episode])
    assert metrics == {
        "rollout/tool_calls_per_turn": 1.0,
        "rollout/invalid_tool_call_rate": 1.0,
        "rollout/tool_calls/sqrt": 1.0,
    }
    assert tool_metrics([]) == {}


async def test_step_rows_without_history_are_refused_for_a_tool_env(pool: EnvPool, tokenizer: Any) -> None:
    session = await pool.open("calculator", {})
    try:
        settings = EpisodeSettings(layout="step", prompt=PromptConfig(history_turns=0))
        with pytest.raises(ToolHistoryError, match="has tools, but step rows with history_turns 0"):
            EpisodeBuilder(tokenizer, settings, session.spec, Episode(0, 0, 1, "calculator"), set())
    finally:
        await session.close()
