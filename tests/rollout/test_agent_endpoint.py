"""The policy as an OpenAI-compatible chat endpoint (issue 33): the official `openai` client talks to the tiny
model through it; every call is recorded as the engine sampled it (token ids, log-probs, policy version); a
conversation that grows keeps its tokens exactly, one that rewrites its history starts a new segment; bad calls
get OpenAI-style errors that harm no other episode. Requests as agents usually write them (issue 47) succeed:
a `max_tokens` over the run's reply budget is clamped to it, any model name is answered, `GET /models` lists the
policy; every route answers OpenAI-style JSON errors; an episode's calls beyond `max_turns` are refused."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.endpoints import serving

from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig

AGENTS = Path(__file__).resolve().parent.parent / "support" / "agents"

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Read a box.", "parameters": {
    "type": "object", "properties": {"box": {"type": "integer"}}, "required": ["box"]}}}]  # fmt: skip


@pytest.fixture
async def endpoint(model_dir: Path, tokenizer: Any) -> AsyncIterator[AgentEndpoint]:
    async with serving(model_dir, tokenizer, EndpointConfig(max_context_tokens=2048, max_tokens=16)) as served:
        yield served


@pytest.fixture
async def client() -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    """Make `openai.AsyncOpenAI` clients for an endpoint's episodes; closed after the test."""
    made: list[openai.AsyncOpenAI] = []

    def connect(served: AgentEndpoint, key: str, api_key: str = "unused") -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=served.url(key), api_key=api_key, max_retries=0))
        return made[-1]

    yield connect
    for made_client in made:
        await made_client.close()


async def test_a_growing_conversation_keeps_its_tokens_and_log_probs_exactly(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    key = endpoint.open()
    agent = client(endpoint, key)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Go."}]
    first = await agent.chat.completions.create(model="policy", messages=messages, logprobs=True, max_tokens=8)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
    second = await agent.chat.completions.create(model="policy", messages=messages, temperature=0.7)

    record = endpoint.finish(key)
    one, two = record.calls
    assert (one.segment, two.segment, len(record.segments)) == (0, 0, 1)
    # token in, token out: the second prompt is the first prompt, the first reply as sampled, then the new turn
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.reply_ids)] == one.prompt_ids + one.reply_ids
    assert [t.logprob for t in first.choices[0].logprobs.content] == one.logprobs
    assert len(one.reply_ids) == first.usage.completion_tokens <= 8 and second.usage.prompt_tokens == len(
        two.prompt_ids
    )
    assert one.policy_version == two.policy_version == 0 and first.system_fingerprint == "policy-v0"
    with pytest.raises(openai.NotFoundError):  # a finished episode takes no more calls
        await agent.chat.completions.create(model="policy", messages=messages)


async def test_a_rewritten_history_starts_a_new_segment(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    key = endpoint.open()
    agent = client(endpoint, key)
    messages = [{"role": "user", "content": "Go."}]
    first = await agent.chat.completions.create(model="policy", messages=messages)
    edited = {"role": "assistant", "content": first.choices[0].message.content + " (edited)"}
    await agent.chat.completions.create(model="policy", messages=[*messages, edited, {"role": "user", "content": "?"}])
    await agent.chat.completions.create(model="policy", messages=messages)  # started over
    record = endpoint.finish(key)
    assert [call.segment for call in record.calls] == [0, 1, 2] and len(record.segments) == 3
    assert record.calls[2].prompt_ids == record.calls[0].prompt_ids  # the same conversation, rendered afresh


async def test_tool_calls_come_back_in_openai_form_and_tool_results_extend_the_segment(
    endpoint: AgentEndpoint, tokenizer: Any, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    """The tiny model's replies are random text: the calls they hold (likely none) come back in OpenAI form; the
    template renders the tool list; a tool result the agent adds extends the same segment."""
    key = endpoint.open()
    agent = client(endpoint, key)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Which box?"}]
    first = await agent.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    reply = first.choices[0].message
    assert reply.tool_calls is None or all(c.type == "function" for c in reply.tool_calls)
    messages += [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": "call_0", "content": "42"}]
    await agent.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    record = endpoint.finish(key)
    assert [call.segment for call in record.calls] == [0, 0]
    assert "<tools>" in tokenizer.decode(record.calls[0].prompt_ids)  # the template rendered the tool list


async def test_bad_calls_get_openai_errors_and_harm_no_other_episode(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    good, other = endpoint.open(), endpoint.open()
    agent = client(endpoint, good)
    ok = [{"role": "user", "content": "Go."}]
    bad_calls = [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0]"),
        ({"messages": ok, "n": 2}, 400, "n"),
        ({"messages": ok, "temperature": -1}, 400, "temperature"),
        ({"messages": ok, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": ok, "stream": True}, 400, "stream"),
        ({"messages": [{"role": "user", "content": "word " * 5000}]}, 413, "messages"),
    ]
    async with httpx.AsyncClient(base_url=endpoint.url(good)) as http:
        for body, status, param in bad_calls:
            answer = await http.post("/chat/completions", json=body)
            assert answer.status_code == status, (body, answer.text)
            assert answer.json()["error"]["param"] == param, answer.text
        assert (await http.post("/chat/completions", content=b"{oops")).status_code == 400
        too_big = await http.post("/chat/completions", content=b" " * (2 << 20))
        assert too_big.status_code == 413
    unknown = client(endpoint, "no-such-episode")
    with pytest.raises(openai.NotFoundError):
        await unknown.chat.completions.create(model="policy", messages=ok)
    # nothing was recorded for the refused calls, and both episodes still answer
    assert endpoint.episodes[good].calls == [] and endpoint.episodes[good].segments == []
    await agent.chat.completions.create(model="policy", messages=ok)
    await client(endpoint, other).chat.completions.create(model="policy", messages=ok)
    assert len(endpoint.finish(good).calls) == len(endpoint.finish(other).calls) == 1


async def test_bound_beyond_loopback_it_needs_a_token(
    model_dir: Path, tokenizer: Any, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    with pytest.raises(ValueError, match="not loopback: set endpoint.token"):
        EndpointConfig(host="0.0.0.0")
    everywhere = EndpointConfig(host="0.0.0.0", advertise="127.0.0.1", token="s3cret", max_context_tokens=2048)
    async with serving(model_dir, tokenizer, replace(everywhere, max_tokens=4)) as served:
        key = served.open()
        ok = [{"role": "user", "content": "Go."}]
        with pytest.raises(openai.AuthenticationError):
            await client(served, key, api_key="wrong").chat.completions.create(model="policy", messages=ok)
        answer = await client(served, key, api_key="s3cret").chat.completions.create(model="policy", messages=ok)
        assert answer.choices[0].message.role == "assistant"


async def test_parallel_calls_of_one_episode_are_answered_one_after_another(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    key = endpoint.open()
    agent = client(endpoint, key)
    ok = [{"role": "user", "content": "Go."}]
    await asyncio.gather(*(agent.chat.completions.create(model="policy", messages=ok) for _ in range(3)))
    record = endpoint.finish(key)
    assert len(record.calls) == 3 and [c.segment for c in record.calls] == [0, 1, 2]


async def test_an_agent_in_node_trains_through_fetch_and_reports_its_reward(endpoint: AgentEndpoint) -> None:
    """The same calls from another language: two turns with Node's `fetch`, then a reward, from nothing but the
    URLs in its environment."""
    key = endpoint.open()
    env = {**os.environ, "OPENAI_BASE_URL": endpoint.url(key), "OPENAI_API_KEY": "unused",
           "ROLL_REWARD_URL": endpoint.reward_url(key)}  # fmt: skip
    agent = await asyncio.create_subprocess_exec(
        "node", str(AGENTS / "two_turns.mjs"), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(agent.communicate(), timeout=120)  # a hang guard, not a timing
    assert agent.returncode == 0, err.decode()
    said = json.loads(out)
    record = endpoint.finish(key)
    one, two = record.calls
    assert (one.segment, two.segment) == (0, 0) and said["logprobs"] == one.logprobs
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.reply_ids)] == one.prompt_ids + one.reply_ids
    assert said["status"] == 200 and (record.reward, record.metrics) == (said["reward"]["reward"], {"turns": 2.0})


async def test_a_reward_is_a_finite_number_reported_once(endpoint: AgentEndpoint) -> None:
    key = endpoint.open()
    async with httpx.AsyncClient() as http:
        url = endpoint.reward_url(key)
        for body, param in [({"reward": "1"}, "reward"), ({"reward": float("nan")}, "reward"),
                            ({"reward": 1, "metrics": {"x": "y"}}, "metrics")]:  # fmt: skip
            answer = await http.post(url, content=json.dumps(body))
            assert (answer.status_code, answer.json()["error"]["param"]) == (400, param), answer.text
        assert (await http.post(url, json={"reward": 0.5})).status_code == 200
        assert (await http.post(url, json={"reward": 1.0})).status_code == 409
        assert (await http.post(endpoint.reward_url("nope"), json={"reward": 1.0})).status_code == 404
    assert endpoint.finish(key).reward == 0.5


async def test_a_client_that_leaves_mid_reply_leaves_a_consistent_record(
    model_dir: Path, tokenizer: Any, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    """The reply it left is recorded whole or not at all; the episode goes on (the agent never saw that reply,
    so its next call starts a new segment)."""
    async with serving(model_dir, tokenizer, EndpointConfig(max_context_tokens=2048, max_tokens=256)) as served:
        key = served.open()
        ok = [{"role": "user", "content": "Go."}]
        async with httpx.AsyncClient(timeout=0.02) as http:  # gone long before 256 tokens are sampled
            with pytest.raises(httpx.TimeoutException):
                await http.post(f"{served.url(key)}/chat/completions", json={"messages": ok, "max_tokens": 256})
        await asyncio.sleep(0.1)
        while served.generating(key):  # the abandoned reply, if its generation goes on, is finished first
            await asyncio.sleep(0.05)
        left = list(served.episodes[key].calls)
        assert left == [] or (len(left) == 1 and len(left[0].reply_ids) == len(left[0].logprobs) > 4)
        await client(served, key).chat.completions.create(model="policy", messages=ok, max_tokens=4)
        record = served.finish(key)
        assert len(record.calls) == len(left) + 1 and [c.segment for c in record.calls] == list(range(len(left) + 1))


async def test_a_max_tokens_over_the_budget_is_clamped_and_any_model_name_is_answered(
    model_dir: Path, tokenizer: Any, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    """An agent written the usual way (``max_tokens=512``, its own model name) gets the run's reply budget (3
    here); the reply cut there ends with ``finish_reason: length``, and each clamped call is counted."""
    async with serving(model_dir, tokenizer, EndpointConfig(max_context_tokens=2048, max_tokens=3)) as served:
        key = served.open()
        agent = client(served, key)
        ok = [{"role": "user", "content": "Go."}]
        first = await agent.chat.completions.create(model="gpt-made-up", messages=ok, max_tokens=512)
        second = await agent.chat.completions.create(model="x", messages=ok, max_completion_tokens=10_000)
        within = await agent.chat.completions.create(model="policy", messages=ok, max_tokens=2)
        record = served.finish(key)
    assert [len(c.reply_ids) for c in record.calls] == [3, 3, 2]  # the tiny model's replies run to the budget
    assert (
        first.choices[0].finish_reason == second.choices[0].finish_reason == "length" == record.calls[0].finish_reason
    )
    assert first.usage.completion_tokens == 3 and first.model == "policy"
    assert served.clamped == 2 and within.usage.completion_tokens == 2  # the call within the budget is not counted


async def test_the_models_route_lists_the_policy(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    models = await client(endpoint, endpoint.open()).models.list()
    assert [(m.id, m.object) for m in models.data] == [("policy", "model")]


async def test_unknown_routes_and_wrong_methods_answer_openai_style_json(
    endpoint: AgentEndpoint, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    key = endpoint.open()
    with pytest.raises(openai.NotFoundError, match="no route POST /episodes/.*/v1/embeddings"):
        await client(endpoint, key).embeddings.create(model="policy", input="Go.")  # a route the endpoint lacks
    async with httpx.AsyncClient(base_url=endpoint.base) as http:
        wrong_method = await http.get(f"/episodes/{key}/v1/chat/completions")
        nowhere = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Go."}]})
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert "GET is not allowed" in wrong_method.json()["error"]["message"]
    assert nowhere.status_code == 404 and nowhere.json()["error"]["type"] == "not_found_error"
    assert endpoint.finish(key).calls == []


async def test_calls_beyond_max_turns_are_refused_naming_the_setting_and_not_recorded(
    model_dir: Path, tokenizer: Any, client: Callable[..., openai.AsyncOpenAI]
) -> None:
    config = EndpointConfig(max_context_tokens=2048, max_tokens=4, max_turns=2)
    async with serving(model_dir, tokenizer, config) as served:
        key = served.open()
        agent = client(served, key)
        ok = [{"role": "user", "content": "Go."}]
        for _ in range(2):
            await agent.chat.completions.create(model="policy", messages=ok)
        with pytest.raises(openai.BadRequestError, match=r"episode\.max_turns=2"):
            await agent.chat.completions.create(model="policy", messages=ok)
        async with httpx.AsyncClient() as http:  # the reward is still taken after the refusal
            assert (await http.post(served.reward_url(key), json={"reward": 1.0})).status_code == 200
        record = served.finish(key)
    assert len(record.calls) == 2 and record.reward == 1.0
