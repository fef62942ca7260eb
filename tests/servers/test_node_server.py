"""The Node.js env server (env_servers/node) driven by the unchanged Python client: "write envs in any gRPC language".

The server runs as a subprocess (`node env_servers/node/server.js --port 0`), announces itself with the same JSON
ready line as `python -m env_servers serve`, and must follow the protocol exactly like the Python server: the
pool plays full episodes over all three transports, and raw stubs check ids, ordering, idempotent replay,
per-item status, capacity, deadlines, health, reflection and the graceful drain.

It also passes the same conformance suite as the Python servers (`env_servers.conformance`), with a second Node
process for the cross-process determinism check.

Needs `node` (>= 18) on PATH; the npm dependencies are installed on first use with
`npm ci --no-audit --no-fund` in env_servers/node (skipped, with the reason, when node or npm is missing).
"""

from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.conformance import conforms

from env_servers.conformance import run_conformance
from roll_lightning.env_client.errors import EpisodeFailed, NoEndpointAvailable
from roll_lightning.env_client.local import LocalServer
from roll_lightning.env_client.pool import EnvPool
from roll_lightning.env_client.tools import ClientToolCall
from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

NODE_DIR = Path(__file__).resolve().parents[2] / "env_servers" / "node"
SERVER_JS = NODE_DIR / "server.js"
NPM_INSTALL = ["npm", "ci", "--no-audit", "--no-fund"]  # run in env_servers/node (installs package-lock.json)
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not on PATH (the Node.js env server needs Node >= 18)")


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The server's npm dependencies, installed on first use."""
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        if shutil.which("npm") is None:
            pytest.skip("npm is not on PATH and env_servers/node/node_modules is missing")
        done = subprocess.run(NPM_INSTALL, cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"{' '.join(NPM_INSTALL)} failed in {NODE_DIR}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return NODE_DIR / "node_modules"


def launch_node_server(*args: str, ready_timeout_s: float = 30.0) -> LocalServer:
    """Start `server.js --host 127.0.0.1 --port 0 ARGS` and wait for its JSON ready line."""
    cmd = [NODE, str(SERVER_JS), "--host", "127.0.0.1", "--port", "0", *args]
    log = tempfile.NamedTemporaryFile("w+", prefix="node-env-server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if select.select([proc.stdout], [], [], 0.1)[0]:
            line = proc.stdout.readline()
            if line.startswith("{"):
                info = json.loads(line)
                assert info["event"] == "serving" and info["pid"] == proc.pid and info["tls"] == ("--tls-cert" in args)
                return LocalServer(proc, info["address"], info["server_id"], log.name)
    proc.kill()
    proc.wait()
    log.seek(0)
    raise RuntimeError(f"node env server ({' '.join(cmd)}) did not start:\n{log.read()[-2000:]}")


@pytest.fixture
def start(node_modules: Path) -> Iterator:
    """Start extra servers with their own flags; all are stopped at the end of the test."""
    servers: list[LocalServer] = []

    def _start(*args: str) -> LocalServer:
        # A short drain unless the test names its own (the last --drain-seconds wins), so that stopping a
        # server with episodes still open at the end of a test does not wait out the default 10 s.
        servers.append(launch_node_server("--drain-seconds", "1", *args))
        return servers[-1]

    yield _start
    for server in servers:
        server.stop(timeout=5)


@pytest.fixture(scope="module")
def node_server(node_modules: Path) -> Iterator[LocalServer]:
    server = launch_node_server("--drain-seconds", "1")  # episodes are left open: do not wait 10 s at the end
    yield server
    server.stop(timeout=5)


@pytest.fixture
def stub(node_server: LocalServer) -> Iterator[pb_grpc.EnvServiceStub]:
    with grpc.insecure_channel(node_server.address) as channel:
        yield pb_grpc.EnvServiceStub(channel)


# -- helpers ---------------------------------------------------------------------------------------------


def create(stub, env_id="guess_number", config=None, request_id=None) -> str:
    request = pb.CreateSessionRequest(env_id=env_id, request_id=request_id or os.urandom(8).hex())
    if config:
        request.config.update(config)
    return stub.CreateSession(request, timeout=10).session_id


def reset(stub, sid, seed=3, rid="r1"):
    return stub.Reset(pb.ResetRequest(session_id=sid, seed=seed, request_id=rid), timeout=10)


def step(stub, sid, ep, index, text="<answer>10</answer>", rid=None, timeout=10):
    request = pb.StepRequest(
        session_id=sid, episode_id=ep, step_index=index, action=pb.Action(text=text), request_id=rid or f"s{index}"
    )
    return stub.Step(request, timeout=timeout)


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kwargs)
    return info.value.code(), info.value.details()


def bisect_raw(stub, sid, seed) -> tuple[int, list[str]]:
    """Play guess_number by bisection over raw stubs; returns (secret, observations)."""
    ep = reset(stub, sid, seed=seed, rid=f"seed{seed}").episode_id
    lo, hi, observations = 1, 20, []
    for index in range(10):
        guess = (lo + hi) // 2
        result = step(stub, sid, ep, index, f"<answer>{guess}</answer>", rid=f"{seed}-{index}")
        observations.append(result.observation)
        if result.terminated:
            assert result.reward == 1.0 and result.metrics["success"] == 1.0
            return guess, observations
        lo, hi = (guess + 1, hi) if "higher" in result.observation else (lo, guess - 1)
    raise AssertionError(f"bisection did not find the secret: {observations}")


# -- the conformance suite ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def second_node_server(node_modules: Path) -> Iterator[LocalServer]:
    server = launch_node_server("--drain-seconds", "1")
    yield server
    server.stop(timeout=5)


FORK_RULES = ["fork-exact", "fork-independent", "fork-retry", "fork-refused", "fork-sessions"]


def test_node_server_conforms(node_server, second_node_server):
    """guess_number on a running server (with a second process for determinism): every rule that needs no
    suite option passes, the fork rules included; "batch-mixed" is not advertised by the Node server, so it is
    skipped."""
    results = conforms(node_server.address, "guess_number", second=second_node_server.address, passed=FORK_RULES)
    skipped = {name for name, outcome in results.items() if outcome.status == "SKIP"}
    assert skipped == {"batch-mixed", "capacity", "idle-reaping", "env-crash", "auth", "loading", "drain"}, results


def test_node_server_started_by_the_suite_passes_every_rule_it_can(node_modules):
    """The whole suite, the server started by it: loading, capacity, reaping, the crash rule, the token, drain."""
    launch = (f"{NODE} {SERVER_JS} crashy --host 127.0.0.1 --port {{port}} --max-sessions 20 --session-ttl 2 "
              "--token s3cret-token --drain-seconds 30")  # fmt: skip
    results = conforms(
        None, "crashy", launch=launch, token="s3cret-token", crash_action="crash", garbage="", passed=FORK_RULES
    )
    skipped = {name for name, outcome in results.items() if outcome.status == "SKIP"}
    assert skipped == {"batch-mixed", "garbage-reply"}, results  # crashy takes any text as a valid action


def test_node_grid_picture_conforms_images_included(node_server, second_node_server):
    """grid_picture sends a PNG with every observation: the images rule passes, across two processes too, and a
    fork's pictures are the original's."""
    conforms(node_server.address, "grid_picture", second=second_node_server.address, passed=["images", *FORK_RULES])


def test_node_reach_number_conforms_tools_included(node_server, second_node_server):
    """reach_number acts through tool calls: the tools rule passes (over Step, BatchStep and the Stream), and a fork
    copies the tool state (the total so far)."""
    conforms(node_server.address, "reach_number", second=second_node_server.address, passed=["tools", *FORK_RULES])


def test_node_slow_env_forks_too(node_server):
    """The async env forks like the others: its copies step (and wait) on their own."""
    lines: list[str] = []
    results = run_conformance(node_server.address, "slow", only=FORK_RULES, report=lines.append)
    assert all(results[name].status == "PASS" for name in FORK_RULES), "\n".join(lines)


def test_node_text_env_answers_calls_as_bad_calls(node_server):
    """The tools rule on a text env: a call to guess_number is a normal step, action_valid=false, an error result."""
    from env_servers.conformance import run_conformance

    lines: list[str] = []
    results = run_conformance(node_server.address, "guess_number", only=["tools"], report=lines.append)
    assert results["tools"].status == "PASS", "\n".join(lines)


@pytest.mark.parametrize("transport", ["batch", "stream", "unary"])
async def test_pool_calls_node_tools(node_server, transport):
    """A valid call and a bad one through the Python client: one result per call, with its id, in order."""
    async with EnvPool([node_server.address], transport=transport) as pool:
        session = await pool.open("reach_number", {"target_max": 5, "max_steps": 4})
        assert [tool.name for tool in session.tools] == ["add", "submit"]
        assert session.tools[0].parameters["properties"]["n"] == {"type": "integer", "minimum": -10, "maximum": 10}
        first = await session.reset(seed=7)
        target = int(first.observation.split()[1].rstrip("."))
        assert first.info["target"] == target and 1 <= target <= 5

        out = await session.step("", [ClientToolCall("c1", "add", json.dumps({"n": target - 1}))])
        assert out.action_valid and out.reward == 0.0 and not out.terminated
        assert [(r.call_id, r.name, r.content, r.is_error) for r in out.tool_results] == [
            ("c1", "add", f"total is {target - 1}", False)
        ]

        bad = [ClientToolCall("c1", "add", '{"n": 1}'), ClientToolCall("c2", "add", '{"n": 99}'),
               ClientToolCall("c3", "nope", "{}"), ClientToolCall("c4", "submit", "{oops")]  # fmt: skip
        out = await session.step("thinking", bad)
        assert [r.call_id for r in out.tool_results] == ["c1", "c2", "c3", "c4"]
        assert [r.is_error for r in out.tool_results] == [False, True, True, True]
        assert out.tool_results[0].content == f"total is {target}", "the good call still ran"
        assert "arguments.n must be <= 10" in out.tool_results[1].content
        assert "unknown tool 'nope'" in out.tool_results[2].content
        assert "are not JSON" in out.tool_results[3].content
        assert not out.action_valid and out.reward == pytest.approx(-0.1) and not out.terminated

        out = await session.step("", [ClientToolCall("s", "submit", "{}")])
        assert out.action_valid and out.reward == 1.0 and out.terminated and out.observation == "Correct."
        assert [(r.call_id, r.content, r.is_error) for r in out.tool_results] == [("s", "correct", False)]
        assert (await session.reset(seed=7)).observation == first.observation, "same seed, same target"


def test_node_tool_rule_repeated_ids_and_no_calls(stub):
    """Raw stubs: a repeated id is a bad call for both calls; text alone is a step without results."""
    sid = create(stub, "reach_number", {"format_penalty": -0.25})
    ep = reset(stub, sid).episode_id
    request = pb.StepRequest(session_id=sid, episode_id=ep, step_index=0, request_id="t0")
    request.action.tool_calls.extend([pb.ToolCall(id="x", name="add", arguments_json='{"n": 1}')] * 2)
    out = stub.Step(request, timeout=5)
    assert [r.call_id for r in out.tool_results] == ["x", "x"] and all(r.is_error for r in out.tool_results)
    assert "used by 2 calls" in out.tool_results[0].content
    assert not out.action_valid and out.reward == -0.25 and out.observation.startswith("Reply with tool calls")
    out = step(stub, sid, ep, 1, "just text", rid="t1")
    assert not out.tool_results and not out.action_valid and out.reward == -0.25


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking its chunks' CRCs and that its pixels inflate to the right size."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, chunks = 8, {}
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        assert struct.unpack(">I", data[at + 8 + length : at + 12 + length])[0] == zlib.crc32(kind + body)
        chunks[kind], at = body, at + 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert len(zlib.decompress(chunks[b"IDAT"])) == (3 * width + 1) * height
    return width, height


@pytest.mark.parametrize("transport", ["batch", "stream", "unary"])
async def test_pool_receives_node_pictures(node_server, transport):
    async with EnvPool([node_server.address], transport=transport) as pool:
        session = await pool.open("grid_picture", {"size": 5, "cell": 4})
        first = await session.reset(seed=11)
        assert first.observation.endswith("<image>") and len(first.images) == 1
        assert first.images[0].media_type == "image/png" and png_size(first.images[0].data) == (20, 20)
        out = await session.step("<answer>up</answer>")
        assert out.action_valid and len(out.images) == 1 and png_size(out.images[0].data) == (20, 20)
        assert (await session.reset(seed=11)).images == first.images, "same seed, same picture bytes"


def test_node_never_sends_an_observation_breaking_an_image_rule(stub):
    sid = create(stub, "crashy")
    ep = reset(stub, sid).episode_id
    code, message = code_of(step, stub, sid, ep, 0, "bad-image")
    assert code == grpc.StatusCode.INTERNAL and "breaks an image rule" in message and "magic bytes" in message
    assert code_of(step, stub, sid, ep, 1)[0] == grpc.StatusCode.FAILED_PRECONDITION, "the episode was aborted"


# -- the Python client, unchanged, over all three transports ---------------------------------------------


@pytest.mark.parametrize("transport", ["batch", "stream", "unary"])
async def test_pool_plays_an_episode_to_success(node_server, transport):
    async with EnvPool([node_server.address], transport=transport) as pool:
        session = await pool.open("guess_number")
        assert session.spec.env_id == "guess_number" and session.spec.example_action == "<answer>10</answer>"
        first = await session.reset(seed=3)
        assert first.seed == 3 and first.episode_id and "between 1 and 20" in first.observation
        assert first.info == {"min": 1.0, "max": 20.0, "max_steps": 10.0}
        invalid = await session.step("I think it is ten")
        assert not invalid.action_valid and invalid.reward == pytest.approx(-0.1) and not invalid.done
        assert invalid.metrics == {"action_valid": 0.0, "success": 0.0} and invalid.info["feedback"] == "invalid"
        lo, hi, rewards = 1, 20, []
        while True:
            guess = (lo + hi) // 2
            outcome = await session.step(f"Let me think... <ANSWER>{guess}</answer>")  # tags are case-insensitive
            rewards.append(outcome.reward)
            assert outcome.action_valid and outcome.info["guess"] == guess
            if outcome.done:
                break
            feedback = outcome.info["feedback"]
            assert feedback in ("higher", "lower") and feedback in outcome.observation
            lo, hi = (guess + 1, hi) if feedback == "higher" else (lo, guess - 1)
        assert outcome.terminated and not outcome.truncated and outcome.reward == 1.0
        assert outcome.metrics == {"action_valid": 1.0, "success": 1.0} and outcome.info["feedback"] == "correct"
        assert rewards[:-1] == [0.0] * (len(rewards) - 1) and len(rewards) <= 5
        with pytest.raises(EpisodeFailed) as failed:
            await session.step("<answer>1</answer>")
        assert failed.value.code == grpc.StatusCode.FAILED_PRECONDITION
        again = await session.reset(seed=3)
        assert again.observation == first.observation and again.episode_id != first.episode_id
        await session.close()


async def test_pool_runs_many_sessions_concurrently(node_server):
    import asyncio

    async with EnvPool([node_server.address]) as pool:
        sessions = [await pool.open("guess_number", {"max_steps": 3}) for _ in range(16)]
        await asyncio.gather(*(s.reset(seed=i) for i, s in enumerate(sessions)))
        for turn in range(3):
            outcomes = await asyncio.gather(*(s.step("<answer>0</answer>") for s in sessions))  # out of range
            assert all(not o.action_valid for o in outcomes)
            assert all(o.truncated == (turn == 2) for o in outcomes)
        assert "the number was" in outcomes[0].observation
        await asyncio.gather(*(s.close() for s in sessions))


# -- protocol rules, over raw stubs ------------------------------------------------------------------------


def test_same_seed_same_secret_in_two_processes(stub, second_node_server):
    other = second_node_server
    with grpc.insecure_channel(other.address) as channel:
        other_stub = pb_grpc.EnvServiceStub(channel)
        secrets = {}
        for seed in (3, 2**64 - 1, 12345678901234567890):
            here, there = bisect_raw(stub, create(stub), seed), bisect_raw(other_stub, create(other_stub), seed)
            assert here == there, "same (env_id, config, seed) => same episode in any process"
            secrets[seed] = here[0]
            assert 1 <= here[0] <= 20
        drawn = {bisect_raw(stub, create(stub), seed)[0] for seed in range(12)}
        assert len(drawn) > 3, f"the secret must depend on the seed: {drawn}"
        narrow = create(other_stub, config={"min": 5, "max": 5})
        first = reset(other_stub, narrow, seed=1)
        assert step(other_stub, narrow, first.episode_id, 0, "<answer>5</answer>").terminated


def test_unseeded_reset_reports_the_seed_it_used(stub):
    drawn = stub.Reset(pb.ResetRequest(session_id=create(stub), request_id="r"), timeout=10)
    assert 0 <= drawn.seed < 2**63
    elsewhere = create(stub)
    assert bisect_raw(stub, elsewhere, drawn.seed) is not None
    replayed = reset(stub, elsewhere, seed=drawn.seed, rid="again")
    assert replayed.observation == drawn.observation and replayed.seed == drawn.seed


def test_retried_step_is_replayed_not_repeated(stub):
    sid = create(stub)
    ep = reset(stub, sid).episode_id
    a = step(stub, sid, ep, 0, rid="same")
    b = step(stub, sid, ep, 0, rid="same")
    assert a == b, "a retry with the same request_id gets the same answer (env_seconds included)"
    c = step(stub, sid, ep, 1, "<answer>1</answer>", rid="next")
    assert c.step_index == 1 and "8 guesses left" in c.observation, "the retried step ran once"


def test_retried_reset_and_create_are_replayed(stub):
    sid = create(stub, request_id="dup")
    assert create(stub, request_id="dup") == sid
    a, b = reset(stub, sid, rid="rr"), reset(stub, sid, rid="rr")
    assert a.episode_id == b.episode_id
    step(stub, sid, a.episode_id, 0)
    code, msg = code_of(reset, stub, sid, rid="rr")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale Reset" in msg


def test_out_of_order_and_stale_steps_are_refused(stub):
    sid = create(stub)
    ep = reset(stub, sid).episode_id
    code, msg = code_of(step, stub, sid, ep, 1)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"step_index=1 but the next step of episode {ep} is 0" == msg
    step(stub, sid, ep, 0, "<answer>1</answer>")
    code, msg = code_of(step, stub, sid, ep, 0, rid="another")  # a new request for an old index
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "step_index=0" in msg
    new_ep = reset(stub, sid, rid="r2").episode_id
    code, msg = code_of(step, stub, sid, ep, 1, rid="late")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and ep in msg and new_ep in msg


def test_step_before_reset_and_after_done(stub):
    sid = create(stub, config={"max_steps": 2})
    code, msg = code_of(step, stub, sid, "ep-x", 0)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "call Reset first" in msg
    ep = reset(stub, sid).episode_id
    step(stub, sid, ep, 0, "no answer tag")
    last = step(stub, sid, ep, 1, "<answer>twenty</answer>")
    assert last.truncated and not last.terminated and not last.action_valid
    code, msg = code_of(step, stub, sid, ep, 2)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"episode {ep} is over (truncated after 2 steps)" in msg
    sid = create(stub)
    secret, _ = bisect_raw(stub, sid, 3)
    ep = reset(stub, sid, rid="won").episode_id
    assert step(stub, sid, ep, 0, f"<answer>{secret}</answer>").terminated
    code, msg = code_of(step, stub, sid, ep, 1)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "terminated" in msg and "call Reset" in msg


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"episode_id": "e", "request_id": "r"}, "session_id"),
        ({"session_id": "s", "request_id": "r"}, "episode_id"),
        ({"session_id": "s", "episode_id": "e"}, "request_id"),
    ],
)
def test_malformed_step_names_the_field(stub, request_fields, field):
    if field != "session_id":  # the session must exist for the field checks behind it
        request_fields = {**request_fields, "session_id": create(stub)}
    code, msg = code_of(stub.Step, pb.StepRequest(**request_fields), timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and field in msg


def test_undecodable_request_is_invalid_argument(node_server):
    with grpc.insecure_channel(node_server.address) as channel:
        raw = channel.unary_unary("/roll_lightning.env.v1.EnvService/Step")
        code, msg = code_of(raw, b"\xff\xff\xff", timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "StepRequest" in msg


def test_create_session_and_describe_errors(stub):
    code, msg = code_of(stub.CreateSession, pb.CreateSessionRequest(env_id="nope", request_id="x"), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in msg and "guess_number" in msg
    for config, key in (({"maxx": 30}, "config.maxx"), ({"max": "many"}, "config.max"), ({"min": 1.5}, "config.min")):
        bad = pb.CreateSessionRequest(env_id="guess_number", request_id="y")
        bad.config.update(config)
        code, msg = code_of(stub.CreateSession, bad, timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and key in msg
    code, msg = code_of(stub.CreateSession, pb.CreateSessionRequest(env_id="guess_number"), timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in msg
    code, msg = code_of(stub.DescribeEnv, pb.DescribeEnvRequest(env_id=""), timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "env_id" in msg


def test_unknown_session_is_not_found(stub):
    code, msg = code_of(stub.Reset, pb.ResetRequest(session_id="s-nope", request_id="r"), timeout=5)
    assert code == grpc.StatusCode.NOT_FOUND and msg == "session 's-nope' is unknown or expired"
    sid = create(stub)
    assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5).existed
    assert not stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5).existed
    assert code_of(reset, stub, sid)[0] == grpc.StatusCode.NOT_FOUND


# -- ForkSession ----------------------------------------------------------------------------------------------


def fork(stub, sid, copies=1, rid="f1") -> pb.ForkSessionResponse:
    return stub.ForkSession(pb.ForkSessionRequest(session_id=sid, copies=copies, request_id=rid), timeout=10)


def active(stub) -> int:
    return stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).active_sessions


def test_retried_fork_returns_the_same_copies_and_makes_none(stub):
    sid = create(stub)
    ep = reset(stub, sid).episode_id
    step(stub, sid, ep, 0, "<answer>1</answer>")
    before = active(stub)
    first = fork(stub, sid, 2, rid="same")
    assert fork(stub, sid, 2, rid="same") == first, "a retry is replayed"
    assert active(stub) == before + 2
    assert first.step_index == 1 and len({f.session_id for f in first.forks} | {sid}) == 3
    another = fork(stub, sid, 1, rid="other")
    assert another.forks[0].session_id not in {f.session_id for f in first.forks}, "a new request_id forks anew"
    assert active(stub) == before + 3


def test_fork_copies_the_session_seed_stream(stub):
    """An unseeded Reset draws its seed from the session's RNG: a copy draws the seed the original draws."""
    sid = create(stub)
    ep = stub.Reset(pb.ResetRequest(session_id=sid, request_id="r"), timeout=10).episode_id
    (copy,) = fork(stub, sid).forks
    assert copy.episode_id != ep
    again = [pb.ResetRequest(session_id=s, request_id="next") for s in (sid, copy.session_id)]
    seeds = [stub.Reset(request, timeout=10).seed for request in again]
    assert seeds[0] == seeds[1]


def test_fork_of_no_episode_in_progress_is_refused(stub):
    never = create(stub)
    code, msg = code_of(fork, stub, never)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "never reset" in msg
    sid = create(stub, config={"max_steps": 1})
    ep = reset(stub, sid).episode_id
    assert step(stub, sid, ep, 0, "no answer").truncated
    code, msg = code_of(fork, stub, sid)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "truncated" in msg
    crashed = create(stub, "crashy")
    ep = reset(stub, crashed).episode_id
    assert code_of(step, stub, crashed, ep, 0, "crash")[0] == grpc.StatusCode.INTERNAL
    code, msg = code_of(fork, stub, crashed)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "aborted" in msg
    for copies in (0, 65):
        code, msg = code_of(fork, stub, sid, copies)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "copies" in msg
    code, msg = code_of(stub.ForkSession, pb.ForkSessionRequest(session_id=sid, copies=1), timeout=5)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in msg
    assert code_of(fork, stub, "s-nope")[0] == grpc.StatusCode.NOT_FOUND


def test_fork_capacity_reaping_and_drain(start):
    """Copies must all fit (none is made otherwise), are reaped when idle, and are refused while draining."""
    server = start("--max-sessions", "3", "--session-ttl", "1", "--drain-seconds", "5")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = create(stub)
        ep = reset(stub, sid).episode_id
        code, msg = code_of(fork, stub, sid, 3)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "room for 2" in msg
        assert active(stub) == 1, "a refused fork makes no copy"
        copies = fork(stub, sid, 2, rid="two").forks
        assert active(stub) == 3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and active(stub) > 1:
            step(stub, sid, ep, 0, "x", rid="keep-alive")  # the original stays in use; its idle copies are reaped
            time.sleep(0.1)
        assert code_of(reset, stub, copies[0].session_id)[0] == grpc.StatusCode.NOT_FOUND
        server.process.send_signal(signal.SIGTERM)
        wait_for_health(channel, health_pb2.HealthCheckResponse.NOT_SERVING)
        code, msg = code_of(fork, stub, sid, 1, rid="during-drain")
        assert code == grpc.StatusCode.UNAVAILABLE and msg.startswith("draining"), msg
        assert fork(stub, sid, 2, rid="two").forks == copies, "a retry of the latest fork is still replayed"
        assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5).existed
        assert server.process.wait(timeout=4) == 0


def test_batch_with_failing_items(stub):
    crashy, healthy = create(stub, "crashy"), create(stub)
    resets = stub.BatchReset(
        pb.BatchResetRequest(
            items=[pb.ResetRequest(session_id=s, seed=1, request_id="r") for s in (crashy, healthy, "s-gone")]
        ),
        timeout=10,
    ).items
    assert [item.status.code for item in resets] == [0, 0, grpc.StatusCode.NOT_FOUND.value[0]]
    assert resets[2].session_id == "s-gone" and "s-gone" in resets[2].status.message
    eps = [item.episode_id for item in resets]

    def item(sid, ep, text):
        return pb.StepRequest(session_id=sid, episode_id=ep, step_index=0, action=pb.Action(text=text), request_id="s")

    batch = [item(crashy, eps[0], "crash"), item("s-missing", "e", "x"), item(healthy, eps[1], "<answer>10</answer>")]
    items = stub.BatchStep(pb.BatchStepRequest(items=batch), timeout=10).items
    assert items[0].status.code == grpc.StatusCode.INTERNAL.value[0] and "boom" in items[0].status.message
    assert items[0].session_id == crashy
    assert items[1].status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert items[2].status.code == 0 and items[2].step_index == 0 and items[2].action_valid
    code, msg = code_of(step, stub, crashy, eps[0], 1, "go")
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "aborted" in msg
    assert reset(stub, crashy, rid="r2").observation == "seed=3 t=0", "the crashed session can start over"
    code, msg = code_of(step, stub, crashy, reset(stub, crashy, rid="r3").episode_id, 0, "crash!")
    assert code == grpc.StatusCode.INTERNAL and "boom" in msg, "unary calls carry the env's failure as the RPC status"


def test_stream_multiplexes_sessions(stub):
    sids = [create(stub) for _ in range(3)]

    def requests():
        for tag, sid in enumerate(sids):
            yield pb.StreamRequest(tag=tag, reset=pb.ResetRequest(session_id=sid, seed=5, request_id="r"))
        yield pb.StreamRequest(tag=99, step=pb.StepRequest(session_id="s-missing", request_id="x", episode_id="e"))
        yield pb.StreamRequest(tag=2**64 - 1)  # neither reset nor step

    answers = {a.tag: a for a in stub.Stream(requests(), timeout=10)}
    assert sorted(answers) == [0, 1, 2, 99, 2**64 - 1]
    assert len({answers[t].reset.observation for t in range(3)}) == 1, "same seed, same start"
    assert answers[99].step.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answers[2**64 - 1].step.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def test_deadline_exceeded_work_is_replayable(stub):
    sid = create(stub, "slow", {"delay_s": 0.4, "max_steps": 10})
    ep = reset(stub, sid).episode_id
    request = pb.StepRequest(session_id=sid, episode_id=ep, step_index=0, action=pb.Action(text="go"), request_id="d")
    code, _ = code_of(stub.Step, request, timeout=0.1)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    replay = stub.Step(request, timeout=10)  # waits for the first run on the session's queue, then replays
    assert replay.step_index == 0 and replay.observation == "seed=3 t=1", "the step ran exactly once"


def test_batch_items_past_the_deadline_do_not_run(stub):
    sids = [create(stub, "slow", {"delay_s": 0.3}) for _ in range(4)]
    eps = [reset(stub, s).episode_id for s in sids]
    batch = pb.BatchStepRequest(
        items=[
            pb.StepRequest(session_id=s, episode_id=e, step_index=0, action=pb.Action(text="go"), request_id="b")
            for s, e in zip(sids, eps, strict=True)
        ]
    )
    code, _ = code_of(stub.BatchStep, batch, timeout=0.45)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    time.sleep(0.5)  # let the batch finish on the server
    replay = stub.BatchStep(batch, timeout=10).items
    assert all(item.status.code == 0 for item in replay)
    assert [item.observation for item in replay] == ["seed=3 t=1"] * 4, "every item ran exactly once"


def test_capacity_limit_and_idle_expiry(start):
    server = start("--max-sessions", "2", "--session-ttl", "0.3")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        assert info.max_sessions == 2 and info.session_ttl_s == pytest.approx(0.3)
        first = create(stub, request_id="a")
        create(stub, request_id="b")
        code, msg = code_of(create, stub, request_id="c")
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "full" in msg
        stub.CloseSession(pb.CloseSessionRequest(session_id=first), timeout=5)
        late = create(stub, request_id="d")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and stub.GetServerInfo(pb.GetServerInfoRequest()).active_sessions:
            time.sleep(0.05)
        code, msg = code_of(reset, stub, late)
        assert code == grpc.StatusCode.NOT_FOUND and "expired" in msg


def test_oversize_actions_are_refused_cleanly(start):
    server = start("--max-action-bytes", "1000", "--max-message-bytes", "65536")
    options = [("grpc.max_send_message_length", 1 << 22)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = create(stub)
        ep = reset(stub, sid).episode_id
        code, msg = code_of(step, stub, sid, ep, 0, "x" * 1001)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "action.text is 1001 bytes; this server accepts 1000"
        code, msg = code_of(step, stub, sid, ep, 0, "é" * 501)  # 1002 bytes of UTF-8
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "1002 bytes" in msg
        code, _ = code_of(step, stub, sid, ep, 0, "x" * 200_000)  # beyond the transport's message limit
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert step(stub, sid, ep, 0).step_index == 0, "the session is unharmed"


def test_server_info_describe_health_and_reflection(node_server, stub):
    info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert info.protocol_version == "v1" and info.server_id == node_server.server_id
    assert list(info.env_ids) == ["guess_number", "grid_picture", "reach_number", "crashy", "slow"]
    assert info.max_sessions == 4096
    assert info.implementation.startswith("env_servers-node/") and {"batch", "stream"} <= set(info.capabilities)
    assert create(stub).startswith(f"s{info.server_id}-"), "session ids start with the server id"
    request = pb.DescribeEnvRequest(env_id="guess_number")
    request.config.update({"max": 100, "max_steps": 7})
    spec = stub.DescribeEnv(request, timeout=5)
    assert spec.env_id == "guess_number" and spec.max_steps == 7 and spec.deterministic
    assert spec.reward_min == pytest.approx(-0.1) and spec.reward_max == 1.0 and list(spec.metrics)
    assert json_format.MessageToDict(spec.config) == {"min": 1, "max": 100, "max_steps": 7, "format_penalty": -0.1}
    schema = json.loads(spec.config_schema)
    assert schema["additionalProperties"] is False and set(schema["properties"]) == set(spec.config.keys())
    with grpc.insecure_channel(node_server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "roll_lightning.env.v1.EnvService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert "roll_lightning.env.v1.EnvService" in services and "grpc.health.v1.Health" in services
        from google.protobuf.descriptor_pool import DescriptorPool

        service = DescriptorPool(database).FindServiceByName("roll_lightning.env.v1.EnvService")
        assert "BatchStep" in service.methods_by_name and "Stream" in service.methods_by_name


def test_capabilities_are_exactly_what_is_served(stub):
    """The header defines "batch", "batch-mixed", "stream", "images", "tools" and "fork"; BatchStep here ignores
    `resets`: no "batch-mixed". Every Node env can be forked."""
    info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
    assert list(info.capabilities) == ["batch", "stream", "images", "tools", "fork"]
    for env_id in info.env_ids:
        assert stub.DescribeEnv(pb.DescribeEnvRequest(env_id=env_id), timeout=5).forkable, env_id


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_v1_and_v1alpha_list_the_env_service(node_server, version):
    from grpc_reflection.v1alpha import reflection_pb2 as rpb  # same wire format as grpc.reflection.v1

    with grpc.insecure_channel(node_server.address) as channel:
        info = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=rpb.ServerReflectionRequest.SerializeToString,
            response_deserializer=rpb.ServerReflectionResponse.FromString,
        )
        requests = [
            rpb.ServerReflectionRequest(list_services=""),
            rpb.ServerReflectionRequest(file_containing_symbol="roll_lightning.env.v1.EnvService"),
        ]
        listed, files = list(info(iter(requests), timeout=5))
    assert "roll_lightning.env.v1.EnvService" in {service.name for service in listed.list_services_response.service}
    assert files.file_descriptor_response.file_descriptor_proto, "the EnvService file descriptor is served"


def test_stream_request_with_neither_is_answered_and_the_stream_goes_on(stub):
    sid = create(stub)
    outbox: queue.Queue = queue.Queue()
    answers = stub.Stream(iter(outbox.get, None), timeout=10)

    def send(request):
        outbox.put(request)
        return next(answers)

    neither = send(pb.StreamRequest(tag=41))
    assert neither.tag == 41 and neither.WhichOneof("result") == "step"
    assert neither.step.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    started = send(pb.StreamRequest(tag=42, reset=pb.ResetRequest(session_id=sid, seed=3, request_id="r")))
    assert started.tag == 42 and started.reset.status.code == 0 and started.reset.episode_id
    action = pb.Action(text="<answer>10</answer>")
    stepped = send(
        pb.StreamRequest(
            tag=43,
            step=pb.StepRequest(
                session_id=sid, episode_id=started.reset.episode_id, step_index=0, action=action, request_id="s"
            ),
        )
    )
    assert stepped.tag == 43 and stepped.step.status.code == 0 and stepped.step.info["feedback"] == "higher"
    outbox.put(None)
    assert list(answers) == []


def test_ok_results_echo_the_request(stub):
    """Every OK ResetResult echoes session_id and the requested seed; every OK StepResult session_id,
    episode_id and step_index: unary, batched, streamed and replayed."""
    sids = [create(stub) for _ in range(3)]
    big = 2**64 - 1

    def check_reset(result, sid, seed):
        assert result.status.code == 0 and result.session_id == sid and result.seed == seed and result.episode_id

    def check_step(result, sid, ep, index):
        assert result.status.code == 0
        assert (result.session_id, result.episode_id, result.step_index) == (sid, ep, index)

    unary = reset(stub, sids[0], seed=big, rid="u")
    check_reset(unary, sids[0], big)
    check_reset(reset(stub, sids[0], seed=big, rid="u"), sids[0], big)  # replayed
    for index in range(2):
        check_step(step(stub, sids[0], unary.episode_id, index, rid=f"u{index}"), sids[0], unary.episode_id, index)
    check_step(step(stub, sids[0], unary.episode_id, 1, rid="u1"), sids[0], unary.episode_id, 1)  # replayed

    seeds = [0, 7, big]
    resets = stub.BatchReset(
        pb.BatchResetRequest(
            items=[pb.ResetRequest(session_id=s, seed=n, request_id="b") for s, n in zip(sids, seeds, strict=True)]
        ),
        timeout=10,
    ).items
    for result, sid, seed in zip(resets, sids, seeds, strict=True):
        check_reset(result, sid, seed)
    assert len({result.episode_id for result in resets} | {unary.episode_id}) == 4, "fresh episode ids"
    steps = stub.BatchStep(
        pb.BatchStepRequest(
            items=[
                pb.StepRequest(session_id=r.session_id, episode_id=r.episode_id, step_index=0, request_id="b0")
                for r in resets
            ]
        ),
        timeout=10,
    ).items
    for result, started in zip(steps, resets, strict=True):
        check_step(result, started.session_id, started.episode_id, 0)

    requests = [
        pb.StreamRequest(tag=i, reset=pb.ResetRequest(session_id=s, seed=100 + i, request_id="t"))
        for i, s in enumerate(sids)
    ]
    streamed = {a.tag: a.reset for a in stub.Stream(iter(requests), timeout=10)}
    for i, sid in enumerate(sids):
        check_reset(streamed[i], sid, 100 + i)
    requests = [
        pb.StreamRequest(
            tag=i, step=pb.StepRequest(session_id=s, episode_id=streamed[i].episode_id, step_index=0, request_id="t0")
        )
        for i, s in enumerate(sids)
    ]
    for answer in stub.Stream(iter(requests), timeout=10):
        check_step(answer.step, sids[answer.tag], streamed[answer.tag].episode_id, 0)


def test_bearer_token(start):
    server = start("--token", "sesame")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        code, _ = code_of(stub.GetServerInfo, pb.GetServerInfoRequest(), timeout=5)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5, metadata=(("authorization", "Bearer sesame"),))
        assert info.protocol_version == "v1"
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, "health stays open"


async def test_tls_and_token_with_the_pool(start, tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("env-host.test")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    (tmp_path / "chain.pem").write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
    server = start("--tls-cert", str(tmp_path / "chain.pem"), "--tls-key", str(tmp_path / "key.pem"), "--token", "t")
    root = ca.cert_pem.bytes()
    async with EnvPool([server.address], tls_root_cert=root, tls_server_name="env-host.test", token="t") as pool:
        session = await pool.open("guess_number")
        await session.reset(seed=3)
        assert (await session.step("<answer>10</answer>")).info["feedback"] == "higher"
    with pytest.raises(NoEndpointAvailable):  # no token: GetServerInfo is refused, so the server is never usable
        async with EnvPool(
            [server.address], tls_root_cert=root, tls_server_name="env-host.test", start_timeout_s=1
        ) as pool:
            await pool.open("guess_number")


def test_sigterm_drains_and_exits_zero(start):
    server = start("--drain-seconds", "5")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = create(stub, "slow", {"delay_s": 0.5, "max_steps": 1})
        ep = reset(stub, sid).episode_id
        results: list = []
        worker = threading.Thread(target=lambda: results.append(step(stub, sid, ep, 0, "go")))
        worker.start()
        time.sleep(0.2)  # the step is in flight
        server.process.send_signal(signal.SIGTERM)
        worker.join(timeout=10)
        assert results and results[0].observation == "seed=3 t=1", "the in-flight step finishes during the drain"
        assert results[0].truncated, "that step ended the last episode in progress"
        assert server.process.wait(timeout=4) == 0, "no episode left: the server stops before --drain-seconds"


def test_drain_refuses_new_episodes_and_finishes_open_ones(start):
    server = start("--drain-seconds", "5")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = create(stub)
        ep = reset(stub, sid).episode_id
        outbox: queue.Queue = queue.Queue()
        answers = stub.Stream(iter(outbox.get, None), timeout=20)

        def send(tag, **kind):
            outbox.put(pb.StreamRequest(tag=tag, **kind))
            return next(answers)

        def step_request(index):
            action, rid = pb.Action(text="<answer>1</answer>"), f"d{index}"
            return pb.StepRequest(session_id=sid, episode_id=ep, step_index=index, action=action, request_id=rid)

        assert send(1, step=step_request(0)).step.status.code == 0
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = send(2, reset=pb.ResetRequest(session_id=sid, seed=1, request_id="new-episode")).reset
        assert refused.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert refused.status.message.startswith("draining"), refused.status.message
        going_on = send(3, step=step_request(1))
        assert going_on.tag == 3 and going_on.step.status.code == 0, "the open episode goes on during the drain"
        outbox.put(None)
        assert list(answers) == []
        assert server.process.poll() is None, "an episode is still in progress: the server waits for it"
        assert stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=5).existed
        assert server.process.wait(timeout=4) == 0


def wait_for_health(channel, wanted, timeout_s=5.0) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        got = health.Check(health_pb2.HealthCheckRequest(service="roll_lightning.env.v1.EnvService"), timeout=5).status
        if got == wanted or time.monotonic() > deadline:
            assert got == wanted
            return
        time.sleep(0.02)


def test_drain_serves_open_episodes_and_stops_when_the_last_one_ends(start):
    """Draining per the proto header: new work refused ("draining"), open episodes served to their end, then exit 0."""
    server = start("--drain-seconds", "60")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        one, two = create(stub, request_id="c1"), create(stub)
        first = reset(stub, one, seed=3, rid="r1")
        second = reset(stub, two, seed=4, rid="r1")  # Reset ids are per session: the same id in both is fine
        assert step(stub, one, first.episode_id, 0, "<answer>10</answer>", rid="a0").info["feedback"] == "higher"
        server.process.send_signal(signal.SIGTERM)
        wait_for_health(channel, health_pb2.HealthCheckResponse.NOT_SERVING)
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5)
        assert info.draining and info.active_sessions == 2
        assert stub.DescribeEnv(pb.DescribeEnvRequest(env_id="guess_number"), timeout=5).env_id == "guess_number"

        # New work is refused with UNAVAILABLE "draining...": a new session, new Resets (unary, batch item, stream).
        code, msg = code_of(create, stub)
        assert code == grpc.StatusCode.UNAVAILABLE and msg.startswith("draining"), msg
        code, msg = code_of(reset, stub, two, seed=5, rid="r2")
        assert code == grpc.StatusCode.UNAVAILABLE and msg.startswith("draining"), msg
        batch_request = pb.BatchResetRequest(items=[pb.ResetRequest(session_id=two, request_id="b")])
        batch = stub.BatchReset(batch_request, timeout=5)
        assert batch.items[0].status.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert batch.items[0].status.message.startswith("draining") and batch.items[0].session_id == two
        stream_request = pb.StreamRequest(tag=7, reset=pb.ResetRequest(session_id=two, request_id="s"))
        streamed = list(stub.Stream(iter([stream_request]), timeout=5))
        assert [a.tag for a in streamed] == [7]
        assert streamed[0].reset.status.code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert streamed[0].reset.status.message.startswith("draining")

        # A retry of an answered request is still replayed, not refused: CreateSession, the latest Reset.
        assert create(stub, request_id="c1") == one
        again = reset(stub, two, seed=4, rid="r1")
        assert again.episode_id == second.episode_id and again.observation == second.observation
        code, msg = code_of(reset, stub, one, seed=3, rid="r1")
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "stale Reset" in msg, "its episode has moved on"

        # Episode one is played to its end over Steps, which keep being served.
        lo, hi = 11, 20
        for index in range(1, 10):
            guess = (lo + hi) // 2
            outcome = step(stub, one, first.episode_id, index, f"<answer>{guess}</answer>", rid=f"a{index}")
            if outcome.terminated:
                break
            lo, hi = (guess + 1, hi) if "higher" in outcome.observation else (lo, guess - 1)
        assert outcome.terminated and outcome.reward == 1.0
        time.sleep(0.3)
        assert server.process.poll() is None, "episode two is still in progress: the server keeps serving"
        assert step(stub, two, second.episode_id, 0, rid="b0").step_index == 0
        assert stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=5).draining

        # Closing the last open episode's session lets the server stop, long before --drain-seconds 60.
        closed_at = time.monotonic()
        assert stub.CloseSession(pb.CloseSessionRequest(session_id=two), timeout=5).existed
        assert server.process.wait(timeout=10) == 0
        assert time.monotonic() - closed_at < 3.0
        assert "no episode in progress" in server.log()


def test_drain_period_bounds_the_wait_for_unfinished_episodes(start):
    server = start("--drain-seconds", "1")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = create(stub)
        ep = reset(stub, sid).episode_id
        assert not step(stub, sid, ep, 0).terminated  # an episode in progress that the client never finishes
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=5) == 0
        waited = time.monotonic() - signalled
        assert 0.8 <= waited < 4.0, f"the server waited out the drain period (1 s) for the episode: {waited:.2f}s"
        assert "drain period over" in server.log()


def test_drain_with_no_episode_in_progress_stops_at_once(start):
    server = start("--drain-seconds", "60")
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        create(stub)  # never reset
        ended = create(stub, config={"max_steps": 1})
        assert step(stub, ended, reset(stub, ended).episode_id, 0, "<answer>1</answer>").truncated
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=10) == 0
        assert time.monotonic() - signalled < 3.0
