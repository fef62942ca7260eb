"""Tool calls through protocol v1 (env.proto, "Tools") over real servers on 127.0.0.1.

Calls and results round-trip through Step, BatchStep and the Stream (raw stubs and the client); every kind of
bad call is a normal step (action_valid=false, the env's penalty, an error result naming the fault) and the env
sees only the good calls; a text env given calls is the same; an env answering the calls wrongly fails the item
with INTERNAL; the client refuses an answer whose results do not match its calls; conformance passes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from support.conformance import conforms
from support.misbehaving import start_misbehaving
from support.servers import start_server

from env_servers import EnvSpec, register
from env_servers.api import Action, Observation, Tool, ToolCall, ToolResult
from env_servers.conformance import run_conformance
from env_servers.server import RunningServer
from env_servers.server.service import EnvService
from roll_lightning.env_client import ClientToolCall, ClientToolResult, EnvPool, ProtocolViolation, tools_of
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class EchoConfig:
    misbehave: str = ""  # "", "count" (drops a result), "ids" (wrong call_id), "text" (a str observation)


@register("tool_echo", EchoConfig)
class EchoEnv:
    """One tool, `echo(text)`; records the actions it was given (to show it never sees a bad call)."""

    seen: list[Action] = []

    def __init__(self, config: EchoConfig) -> None:
        self.config = config

    @classmethod
    def describe(cls, config: EchoConfig) -> EnvSpec:
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return EnvSpec("tool_echo", "1", "Echo.", "echo(text)", "", 3, -1.0, 1.0, tools=(Tool("echo", "echo", schema),))

    def reset(self, seed: int, options: object = None) -> tuple[str, dict]:
        return "start", {}

    def step(self, action: Action) -> tuple[Observation | str, float, bool, bool, dict]:
        EchoEnv.seen.append(action)
        results = [ToolResult(c.id, c.name, json.loads(c.arguments)["text"]) for c in action.tool_calls]
        if self.config.misbehave == "count" and results:
            results.pop()
        if self.config.misbehave == "ids" and results:
            results[0] = ToolResult("other", "echo", "x")
        if self.config.misbehave == "text":
            return "no results", 0.5, False, False, {}
        return Observation("ok", tool_results=tuple(results)), 0.5, False, False, {"metrics": {"action_valid": 1.0}}


@pytest.fixture(scope="module")
def running() -> Iterator[RunningServer]:
    server = start_server(env_ids=("calculator", "tool_echo", "frozenlake"), max_sessions=64, session_ttl_s=60)
    yield server
    server.stop()


@pytest.fixture
def stub(running: RunningServer) -> Iterator[pb_grpc.EnvServiceStub]:
    with grpc.insecure_channel(running.address) as channel:
        yield pb_grpc.EnvServiceStub(channel)


def rid() -> str:
    return uuid.uuid4().hex


def call(call_id: str, name: str = "echo", arguments: str = '{"text": "hi"}') -> pb.ToolCall:
    return pb.ToolCall(id=call_id, name=name, arguments_json=arguments)


def first_step(stub: pb_grpc.EnvServiceStub, env_id: str, calls: list[pb.ToolCall], **config: object) -> pb.StepRequest:
    create = pb.CreateSessionRequest(env_id=env_id, request_id=rid())
    create.config.update(config)
    session = stub.CreateSession(create).session_id
    episode = stub.Reset(pb.ResetRequest(session_id=session, seed=3, request_id=rid())).episode_id
    request = pb.StepRequest(session_id=session, episode_id=episode, step_index=0, request_id=rid())
    request.action.text = "text"
    request.action.tool_calls.extend(calls)
    return request


def test_the_spec_lists_tools_and_tools_is_advertised(stub: pb_grpc.EnvServiceStub) -> None:
    assert "tools" in stub.GetServerInfo(pb.GetServerInfoRequest()).capabilities
    spec = stub.DescribeEnv(pb.DescribeEnvRequest(env_id="calculator"))
    created = stub.CreateSession(pb.CreateSessionRequest(env_id="calculator", request_id=rid())).spec
    assert spec == created and [t.name for t in spec.tools] == ["calculate", "answer"]
    assert json.loads(spec.tools[1].parameters_json)["required"] == ["value"]
    parameters = json.loads(spec.tools[0].parameters_json)
    function = {"name": "calculate", "description": spec.tools[0].description, "parameters": parameters}
    assert tools_of(spec)[0] == {"type": "function", "function": function}
    assert not stub.DescribeEnv(pb.DescribeEnvRequest(env_id="frozenlake")).tools


def test_calls_round_trip_over_step_batch_step_and_the_stream(stub: pb_grpc.EnvServiceStub) -> None:
    calls = [call("a", arguments='{"text": "one"}'), call("b", arguments='{"text": "two"}')]
    expected = [("a", "echo", "one", False), ("b", "echo", "two", False)]

    def got(result: pb.StepResult) -> list[tuple]:
        assert result.status.code == 0 and result.action_valid and result.reward == 0.5
        return [(r.call_id, r.name, r.content, r.is_error) for r in result.tool_results]

    assert got(stub.Step(first_step(stub, "tool_echo", calls))) == expected
    (item,) = stub.BatchStep(pb.BatchStepRequest(items=[first_step(stub, "tool_echo", calls)])).items
    assert got(item) == expected
    request = first_step(stub, "tool_echo", calls)
    (answer,) = list(stub.Stream(iter([pb.StreamRequest(tag=9, step=request)])))
    assert answer.tag == 9 and got(answer.step) == expected
    assert EchoEnv.seen[-1] == Action("text", tuple(ToolCall(c.id, c.name, c.arguments_json) for c in calls))


BAD = [  # (the bad call, words its error result holds)
    (call("x", name="shout"), "unknown tool 'shout' (tools: echo)"),
    (call("x", arguments="{not json"), "are not JSON"),
    (call("x", arguments="[1]"), "must be a JSON object"),
    (call("x", arguments='{"text": 5}'), "arguments.text must be string"),
    (call("x", arguments="{}"), "arguments.text is required"),
    (call(""), "has no id"),
]


@pytest.mark.parametrize(("bad", "words"), BAD, ids=["unknown", "json", "not-object", "schema", "required", "no-id"])
def test_a_bad_call_is_a_normal_step_and_the_env_sees_only_the_good_ones(
    stub: pb_grpc.EnvServiceStub, bad: pb.ToolCall, words: str
) -> None:
    good = call("g", arguments='{"text": "fine"}')
    out = stub.Step(first_step(stub, "tool_echo", [good, bad]))
    assert not out.action_valid and out.reward == -1.0  # the spec's reward_min: tool_echo has no bad_call_penalty
    assert out.metrics["action_valid"] == 0.0  # the runtime's verdict overrides the env's metric
    (ok, error) = out.tool_results
    assert (ok.call_id, ok.content, ok.is_error) == ("g", "fine", False)
    assert error.call_id == bad.id and error.is_error and words in error.content
    assert [c.id for c in EchoEnv.seen[-1].tool_calls] == ["g"]


def test_repeated_ids_are_bad_calls_and_the_calculator_charges_its_penalty(stub: pb_grpc.EnvServiceStub) -> None:
    out = stub.Step(first_step(stub, "tool_echo", [call("s"), call("t"), call("s")]))
    assert not out.action_valid and [(r.call_id, r.is_error) for r in out.tool_results] == [
        ("s", True), ("t", False), ("s", True)]  # fmt: skip
    assert "used by 2 calls" in out.tool_results[0].content and [c.id for c in EchoEnv.seen[-1].tool_calls] == ["t"]
    answer = call("a", name="answer", arguments='{"value": "seven"}')
    out = stub.Step(first_step(stub, "calculator", [answer], format_penalty=-0.25))
    assert (out.action_valid, out.reward, out.terminated) == (False, -0.25, False)


def test_text_envs_are_unchanged_and_calls_to_them_are_bad(stub: pb_grpc.EnvServiceStub) -> None:
    request = first_step(stub, "frozenlake", [])
    request.action.text = "<answer>Left</answer>"
    plain = stub.Step(request)
    assert plain.action_valid and not plain.tool_results
    out = stub.Step(first_step(stub, "frozenlake", [call("c1", name="move")]))
    assert out.status.code == 0 and not out.action_valid and out.step_index == 0
    (error,) = out.tool_results
    assert error.call_id == "c1" and error.is_error and "this env has no tools" in error.content
    text_only = stub.Step(first_step(stub, "calculator", []))  # text alone to a tool env: the env's own verdict
    assert not text_only.action_valid and not text_only.tool_results and text_only.reward == -0.1


@pytest.mark.parametrize("misbehave", ["count", "ids", "text"])
def test_an_env_answering_the_calls_wrongly_fails_the_item(stub: pb_grpc.EnvServiceStub, misbehave: str) -> None:
    request = first_step(stub, "tool_echo", [call("a"), call("b")], misbehave=misbehave)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Step(request)
    assert refused.value.code() == grpc.StatusCode.INTERNAL and "tool results break the rule" in refused.value.details()
    request.step_index, request.request_id = 1, rid()
    with pytest.raises(grpc.RpcError) as after:  # the episode was aborted
        stub.Step(request)
    assert after.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize("transport", ["unary", "batch", "stream"])
async def test_the_client_plays_the_calculator(running: RunningServer, transport: str) -> None:
    async with EnvPool([running.address], transport=transport) as pool:
        session = await pool.open("calculator")
        assert [t.name for t in session.tools] == ["calculate", "answer"] and len(tools_of(session.spec)) == 2
        question = (await session.reset(seed=11)).info["question"]
        out = await session.step("", [ClientToolCall("1", "calculate", json.dumps({"expression": question}))])
        (result,) = out.tool_results
        assert out.action_valid and result == ClientToolResult("1", "calculate", result.content, False)
        out = await session.step("done", [ClientToolCall("2", "answer", json.dumps({"value": float(result.content)}))])
        assert (
            out.terminated and out.reward == 1.0 and out.tool_results == (ClientToolResult("2", "answer", "correct"),)
        )
        lake = await pool.open("frozenlake")
        await lake.reset(seed=1)
        assert (await lake.step("<answer>Left</answer>")).tool_results == () and lake.tools == ()


class WrongResults(EnvService):
    """Answers tool calls with the results' ids swapped: a protocol bug the client must refuse."""

    def _step_item(self, req: pb.StepRequest) -> pb.StepResult:
        result = pb.StepResult()
        result.CopyFrom(super()._step_item(req))
        if len(result.tool_results) == 2:
            first, second = (pb.ToolResult(), pb.ToolResult())
            first.CopyFrom(result.tool_results[1])
            second.CopyFrom(result.tool_results[0])
            del result.tool_results[:]
            result.tool_results.extend([first, second])
        elif result.tool_results:
            del result.tool_results[:]
        return result


async def test_the_client_refuses_results_that_do_not_match_the_calls() -> None:
    server = start_misbehaving(WrongResults, env_ids=("tool_echo",))
    try:
        async with EnvPool([server.address], transport="unary") as pool:
            session = await pool.open("tool_echo")
            await session.reset(seed=1)
            with pytest.raises(ProtocolViolation, match="made 1 tool calls but the answer carries 0 tool results"):
                await session.step("", [ClientToolCall("a", "echo", '{"text": "x"}')])
            session = await pool.open("tool_echo")
            await session.reset(seed=1)
            calls = [ClientToolCall("a", "echo", '{"text": "x"}'), ClientToolCall("b", "echo", '{"text": "y"}')]
            with pytest.raises(ProtocolViolation, match="tool result 0 names call_id 'b', but call 0 has id 'a'"):
                await session.step("", calls)
    finally:
        server.stop()


def test_conformance_passes_for_the_tool_envs_and_a_text_env() -> None:
    envs = ("calculator", "lookup", "frozenlake")
    servers = [start_server(env_ids=envs, max_sessions=20, session_ttl_s=2) for _ in range(2)]
    try:
        for env_id in envs:
            conforms(servers[0].address, env_id, second=servers[1].address, passed=["tools"])
    finally:
        for server in servers:
            server.stop()


def test_conformance_fails_a_server_that_refuses_bad_calls_with_an_rpc_error() -> None:
    class Refuses(EnvService):
        def _step_item(self, req: pb.StepRequest) -> pb.StepResult:
            if any(c.name != "echo" for c in req.action.tool_calls):
                from env_servers.server.sessions import ProtocolError

                raise ProtocolError(grpc.StatusCode.INVALID_ARGUMENT, "unknown tool")
            return super()._step_item(req)

    server = start_misbehaving(Refuses, env_ids=("tool_echo",))
    try:
        results = run_conformance(server.address, "tool_echo", only=["tools"], report=lambda line: None)
        assert results["tools"].failed and "INVALID_ARGUMENT" in results["tools"].detail
    finally:
        server.stop()
