"""MCP servers as tool envs (`mcp:<module>:<Task>`): a real MCP server (`support.mcp_servers`, the SDK's
MCPServer) started as a subprocess over stdio (and once over streamable HTTP), driven through the env class, the
CLI and a gRPC server."""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from env_servers.ports import free_port

pytest.importorskip("mcp", reason="the optional [mcp] extra is not installed")

from env_servers.api import Action, ConfigError, Observation, ToolCall  # noqa: E402
from env_servers.registry import get_env  # noqa: E402

TESTS = Path(__file__).parents[2]
CAPITALS = "mcp:support.mcp_tasks:CapitalTask"
SERVER = [sys.executable, "-m", "support.mcp_servers"]


def make(env_id: str = CAPITALS, **config):
    entry = get_env(env_id)
    return entry.make(entry.make_config(config))


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if alive(p)]


def mcp_children() -> list[psutil.Process]:
    found = []
    for process in children():
        try:
            if "support.mcp_servers" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def wait_gone(timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while mcp_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    return mcp_children()


def calls(*items: tuple[str, str]) -> Action:
    return Action("", tuple(ToolCall(f"c{i}", name, args) for i, (name, args) in enumerate(items)))


@pytest.fixture
def env():
    env = make(server_command=SERVER, server_cwd=str(TESTS), max_steps=3, bad_call_penalty=-0.5)
    yield env
    env.close()
    assert not wait_gone(), "closing the env stops its MCP server"


def test_describe_lists_the_server_tools_with_their_schemas(env):
    spec = get_env(CAPITALS).describe(env.config)
    tools = {tool.name: tool for tool in spec.tools}
    assert list(tools) == ["answer", "lookup", "add", "picture"], "the task's own tools first, then the server's"
    assert tools["lookup"].description.startswith("The capital city of a country")
    assert tools["lookup"].parameters["properties"]["key"]["type"] == "string"
    assert tools["add"].parameters["required"] == ["a", "b"]
    assert tools["add"].parameters["properties"]["a"]["type"] == "number"
    assert spec.env_id == CAPITALS and spec.reward_min == -0.5 and spec.reward_max == 1.0
    assert "lookup" in spec.instruction and spec.max_steps == 3


def test_valid_calls_return_the_server_results_under_their_ids(env):
    first, info = env.reset(4)
    assert first.startswith("What is the capital of ") and info["tools"] == 4
    obs, reward, terminated, truncated, info = env.step(
        calls(("lookup", '{"key": "Peru"}'), ("add", '{"a": 1, "b": 2.5}'), ("picture", ""), ("lookup", '{"key": "X"}'))
    )
    assert isinstance(obs, Observation) and obs.text == ""
    assert [(r.call_id, r.name, r.content, r.is_error) for r in obs.tool_results] == [
        ("c0", "lookup", "Lima", False),
        ("c1", "add", "3.5", False),
        ("c2", "picture", "[image omitted: image/png]\na red pixel", False),  # non-text parts: a placeholder
        ("c3", "lookup", "Error executing tool lookup: no entry for 'X'", True),  # the tool's error: a valid call
    ]
    assert info["action_valid"] and reward == 0.0 and not terminated and not truncated
    assert info["metrics"] == {"action_valid": 1.0, "tool_calls": 4.0, "tool_errors": 1.0}


@pytest.mark.parametrize(
    ("name", "arguments", "says"),
    [
        ("nope", "{}", "unknown tool 'nope'"),
        ("add", '{"a": 1', "arguments are not JSON"),
        ("add", "[1, 2]", "arguments must be a JSON object"),
        ("add", '{"a": "x", "b": 1}', "do not match the schema at a: 'x' is not of type 'number'"),
        ("lookup", "{}", "'key' is a required property"),
        ("answer", '{"city": 3}', "do not match the schema at city"),
    ],
)
def test_bad_calls_are_error_results_not_exceptions(env, name, arguments, says):
    env.reset(0)
    obs, reward, terminated, _, info = env.step(calls(("lookup", '{"key": "Kenya"}'), (name, arguments)))
    good, bad = obs.tool_results
    assert good.content == "Nairobi" and not good.is_error, "the good call of the step still runs"
    assert bad.call_id == "c1" and bad.is_error and says in bad.content
    assert not info["action_valid"] and reward == -0.5 and not terminated


def test_calls_past_the_per_step_limit_are_refused(env):
    env.reset(0)
    many = calls(*[("add", '{"a": 1, "b": 1}')] * 10)
    obs, reward, _, _, info = env.step(many)
    assert [r.is_error for r in obs.tool_results] == [False] * 8 + [True] * 2
    assert "too many calls" in obs.tool_results[-1].content and reward == -0.5 and not info["action_valid"]


def test_rewards_follow_the_task(env):
    from support.mcp_servers import CAPITALS as TABLE

    question, _ = env.reset(7)
    country = question.removeprefix("What is the capital of ").split("?")[0]
    assert env.step(Action("thinking"))[1:4] == (0.0, False, False), "no answer yet: no reward, not over"
    lookup = env.step(calls(("lookup", json.dumps({"key": country}))))[0].tool_results[0].content
    assert lookup == TABLE[country]
    obs, reward, terminated, truncated, _ = env.step(calls(("answer", json.dumps({"city": lookup}))))
    assert obs.tool_results[0].content == f"answer recorded: {lookup}"
    assert (reward, terminated, truncated) == (1.0, True, False)

    env.reset(7)
    assert env.step(calls(("answer", '{"city": "Atlantis"}')))[1:3] == (0.0, True), "a wrong answer ends it"
    env.reset(7)
    assert env.step(Action(f"<answer>{TABLE[country]}</answer>"))[1:3] == (1.0, True), "an answer in the text"
    env.reset(7)
    assert [env.step("no tools")[3] for _ in range(3)] == [False, False, True], "max_steps truncates"


def test_same_seed_same_question_and_reset_keeps_one_server(env):
    pid = [p.pid for p in mcp_children()]
    assert len(pid) == 1
    first = env.reset(3)[0]
    env.step(calls(("lookup", '{"key": "Peru"}')))
    assert env.reset(3)[0] == first
    assert [p.pid for p in mcp_children()] == pid, "a reset reuses the running server"


def test_restart_per_episode_and_a_dead_server():
    env = make(restart_per_episode=True)
    try:
        env.reset(0)
        (before,) = mcp_children()
        env.reset(1)
        (after,) = mcp_children()
        assert after.pid != before.pid and not alive(before), "a fresh server for each episode"
        after.kill()
        after.wait(5)
        with pytest.raises(RuntimeError, match="MCP server .*support.mcp_servers"):
            env.step(calls(("lookup", '{"key": "Peru"}')))  # the runtime turns this into INTERNAL
        env.reset(2)  # and the next reset starts the server again
        assert env.step(calls(("lookup", '{"key": "Peru"}')))[0].tool_results[0].content == "Lima"
    finally:
        env.close()
    assert not wait_gone()


def test_an_env_dropped_without_close_stops_its_server():
    env = make()
    assert len(mcp_children()) == 1
    del env
    gc.collect()
    assert not wait_gone(), "the weakref finalizer closes the session"


@pytest.mark.parametrize(
    "command",
    [["/no/such/mcp-server"], [sys.executable, "-c", "pass"], [sys.executable, "-c", "import time; time.sleep(60)"]],
)
def test_a_server_that_does_not_start_is_one_error_naming_the_command(command):
    before = {p.pid for p in children()}
    with pytest.raises(RuntimeError, match=re.escape(f"MCP server (command {json.dumps(command)}) did not start")):
        make(server_command=command, start_timeout_s=1.0)
    assert {p.pid for p in children()} <= before, "no process is left behind"


def test_bad_configs_and_ids_name_the_key():
    entry = get_env(CAPITALS)
    for values, key in [
        ({"server_command": ["x"], "url": "http://h/mcp"}, "server_command or url"),
        ({"url": "ftp://h"}, "url must be http"),
        ({"server_env": '{"A": 1}'}, "server_env"),
        ({"task_config": "[]"}, "task_config"),
        ({"call_timeout_s": 0}, "call_timeout_s"),
        ({"command": ["x"]}, "config.command: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=key):
            entry.make_config(values)
    with pytest.raises(ConfigError, match="config.server_command: .* needs an MCP server"):
        get_env("mcp:support.mcp_tasks:ServerlessTask").make_config({})
    with pytest.raises(KeyError, match="cannot load the task class"):
        get_env("mcp:support.mcp_tasks:NoSuchTask")
    with pytest.raises(KeyError, match="name a task class"):
        get_env("mcp:support")
    schema = {f: entry.config_cls.__dataclass_fields__[f].metadata.get("server_only") for f in ("url", "max_steps")}
    assert schema == {"url": True, "max_steps": None}, "a client can never pick the command the server runs"


def test_streamable_http_server():
    port = free_port()
    server = subprocess.Popen([*SERVER, "--http", str(port)], cwd=TESTS, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        env = make(url=f"http://127.0.0.1:{port}/mcp")
        try:
            assert [t.name for t in env.tools] == ["answer", "lookup", "add", "picture"]
            env.reset(0)
            assert env.step(calls(("add", '{"a": 2, "b": 3}')))[0].tool_results[0].content == "5.0"
        finally:
            env.close()
    finally:
        server.terminate()
        server.wait(10)


def test_cli_describe_lists_the_tools():
    env = {**os.environ, "PYTHONPATH": f"{TESTS}:{TESTS.parent}"}
    out = subprocess.run(
        [sys.executable, "-m", "env_servers", "describe", CAPITALS],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    ).stdout
    spec = json.loads(out)
    assert [tool["name"] for tool in spec["tools"]] == ["answer", "lookup", "add", "picture"]
    assert not wait_gone()


def test_served_over_grpc_with_tool_calls():
    """End to end through a gRPC server (needs the runtime's tool support: env_servers.server.tools)."""
    pytest.importorskip("env_servers.server.tools", reason="the server runtime has no tool calls yet")
    import grpc
    from support.servers import start_server

    from roll_lightning.protocol.v1 import env_pb2 as pb
    from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

    server = start_server(env_ids=(CAPITALS,), max_sessions=4)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            with pytest.raises(grpc.RpcError, match="server_command can only be set by the server operator"):
                config = pb.CreateSessionRequest(env_id=CAPITALS, request_id="bad").config
                config.update({"server_command": ["sh"]})
                stub.CreateSession(pb.CreateSessionRequest(env_id=CAPITALS, request_id="bad", config=config))
            created = stub.CreateSession(pb.CreateSessionRequest(env_id=CAPITALS, request_id="c1"), timeout=30)
            assert [tool.name for tool in created.spec.tools] == ["answer", "lookup", "add", "picture"]
            assert json.loads(created.spec.tools[2].parameters_json)["required"] == ["a", "b"]
            sid = created.session_id
            first = stub.Reset(pb.ResetRequest(session_id=sid, seed=5, request_id="r1"), timeout=30)
            country = first.observation.removeprefix("What is the capital of ").split("?")[0]

            def step(index: int, *items: tuple[str, str]) -> pb.StepResult:
                tool_calls = [pb.ToolCall(id=f"t{i}", name=n, arguments_json=a) for i, (n, a) in enumerate(items)]
                action = pb.Action(text="", tool_calls=tool_calls)
                request = pb.StepRequest(
                    session_id=sid, episode_id=first.episode_id, step_index=index, action=action, request_id=f"s{index}"
                )
                return stub.Step(request, timeout=30)

            looked = step(0, ("lookup", json.dumps({"key": country})), ("nope", "{}"))
            assert [(r.call_id, r.is_error) for r in looked.tool_results] == [("t0", False), ("t1", True)]
            assert not looked.action_valid and looked.reward == pytest.approx(-0.1)
            city = looked.tool_results[0].content
            answered = step(1, ("answer", json.dumps({"city": city})))
            assert answered.action_valid and answered.reward == 1.0 and answered.terminated
            assert len(mcp_children()) == 1
            stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=30)
            assert not wait_gone(), "closing the session stops its MCP server"
    finally:
        server.stop()


def test_serve_cli_and_no_orphans_after_the_server_exits():
    """`python -m env_servers serve mcp:...` serves the task; its MCP servers end with it (stdin EOF), even with
    a session still open when it is stopped."""
    import grpc

    from roll_lightning.protocol.v1 import env_pb2 as pb
    from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

    env = {**os.environ, "PYTHONPATH": f"{TESTS}:{TESTS.parent}"}
    command = [sys.executable, "-m", "env_servers", "serve", CAPITALS, "--port", "0", "--drain-seconds", "1"]
    serve = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        ready = json.loads(serve.stdout.readline())
        assert ready["event"] == "serving" and ready["envs"] == [CAPITALS]
        with grpc.insecure_channel(ready["address"]) as channel:
            stub = pb_grpc.EnvServiceStub(channel)
            stub.CreateSession(pb.CreateSessionRequest(env_id=CAPITALS, request_id="c1"), timeout=30)
        spawned = mcp_children()
        assert spawned, "the session's MCP server runs under the env server"
    finally:
        serve.terminate()
        serve.wait(30)
    # An orphan is re-parented away from us: follow the processes themselves, not our descendants.
    deadline = time.monotonic() + 10
    while any(alive(p) for p in spawned) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in spawned if alive(p)], "no MCP server outlives the env server"
