"""OpenEnv environments served over our protocol (ids ``openenv:...``, the real `openenv-core`): an env written
here run in-process and from its own OpenEnv server, an MCP env's tools as our tool calls, the published
`openenv-dipg-safety` package both ways, the conformance suite on the adapted servers, and every way a foreign
env fails (an exception, a timeout, a malformed answer, a server that dies) ending as our typed failure."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from support.conformance import conforms
from support.openenv_envs import dipg_dataset, running
from support.servers import start_server

from env_servers.api import ConfigError
from env_servers.registry import get_env
from roll_lightning.env_client import ClientToolCall, EnvPool
from roll_lightning.env_client.errors import EpisodeFailed

GUESS, NOTES = "openenv:support.openenv_envs:GuessEnv", "openenv:support.openenv_envs:NotesEnv"
MOVES = "openenv:support.openenv_envs:MovesEnv"
DIPG = "openenv:med_safety_gym.app:get_environment"
DIPG_CONFIG = {"reward_min": -50.0, "reward_max": 50.0, "deterministic": False}


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    with running("-m", "support.openenv_envs", "guess") as served:
        yield served.url


async def _bisect(session) -> tuple[list[str], dict[str, float]]:
    low, high, seen = 1, 9, []
    first = await session.reset(seed=5)
    assert first.observation == "Guess my number from 1 to 9."
    for _ in range(5):
        guess = (low + high) // 2
        out = await session.step(str(guess))
        seen.append(out.observation)
        assert out.action_valid and not out.truncated
        if out.terminated:
            assert out.reward == 1.0
            return seen, out.metrics
        low, high = (guess + 1, high) if out.observation == "higher" else (low, guess - 1)
    raise AssertionError(f"bisection did not win: {seen}")


async def test_an_openenv_env_is_played_in_process_and_from_its_own_server(guess_url: str) -> None:
    remote = f"openenv:{guess_url}"
    server = start_server(env_ids=(GUESS, remote))
    try:
        async with EnvPool([server.address]) as pool:
            here, there = await pool.open(GUESS), await pool.open(remote)
            assert here.spec.instruction == "Guess my number from 1 to 9." and "'guess'" in here.spec.action_format
            (played, metrics), (played_there, metrics_there) = await _bisect(here), await _bisect(there)
            assert played == played_there, "the same seed plays the same game both ways"
            assert metrics["distance"] == 0.0, "metadata's numbers are metrics"
            assert "distance" not in metrics_there, "OpenEnv's wire drops metadata"
            await here.reset(seed=1)
            bad = await here.step("seven")  # the env itself says the action was not valid
            assert not bad.action_valid and bad.metrics["action_valid"] == 0.0 and not bad.terminated
    finally:
        server.stop()


async def test_an_mcp_envs_tools_become_our_tool_calls() -> None:
    server = start_server(env_ids=(NOTES,))
    try:
        async with EnvPool([server.address]) as pool:
            session = await pool.open(NOTES)
            assert [tool.name for tool in session.tools] == ["read", "answer"]
            assert session.tools[0].parameters["properties"]["box"]["type"] == "integer"
            await session.reset(seed=0)
            read = await session.step("", [ClientToolCall("c1", "read", '{"box": 3}')])
            assert [(r.call_id, r.content, r.is_error) for r in read.tool_results] == [("c1", "code 33", False)]
            assert read.action_valid and not read.terminated
            text_only = await session.step("I think it is 33")  # no call: refused, the episode goes on
            assert not text_only.action_valid and text_only.reward == -0.1 and "read, answer" in text_only.observation
            unknown = await session.step("", [ClientToolCall("c2", "write", "{}")])  # refused by our runtime
            assert unknown.tool_results[0].is_error and not unknown.action_valid
            done = await session.step("", [ClientToolCall("c3", "answer", '{"code": "33"}')])
            assert done.terminated and done.reward == 1.0 and done.tool_results[0].content == "answered"
    finally:
        server.stop()


async def test_an_mcp_env_in_openenv_s_production_mode_is_played_from_its_server() -> None:
    """Production mode drops ``/reset``, ``/step`` and ``/state``; the adapter speaks ``/ws``, which stays."""
    with running("-m", "support.openenv_envs", "notes@production") as served:
        assert httpx.post(f"{served.url}/reset", json={}).status_code == 404, "not production mode"
        remote = f"openenv:{served.url}"
        server = start_server(env_ids=(remote,))
        try:
            async with EnvPool([server.address]) as pool:
                session = await pool.open(remote)
                assert [tool.name for tool in session.tools] == ["read", "answer"]
                await session.reset(seed=0)
                read = await session.step("", [ClientToolCall("c1", "read", '{"box": 3}')])
                assert [(r.content, r.is_error) for r in read.tool_results] == [("code 33", False)]
                done = await session.step("", [ClientToolCall("c2", "answer", '{"code": "33"}')])
                assert done.terminated and done.reward == 1.0
        finally:
            server.stop()


def test_conformance_passes_on_adapted_openenv_envs(guess_url: str) -> None:
    remote = f"openenv:{guess_url}"
    server, second = start_server(env_ids=(GUESS, remote, NOTES)), start_server(env_ids=(GUESS, remote, NOTES))
    try:
        for env_id, garbage in ((GUESS, "seven"), (remote, "seven")):
            conforms(server.address, env_id, second=second.address, garbage=garbage)
        conforms(server.address, NOTES, second=second.address, garbage=None, passed=["tools"])
    finally:
        server.stop()
        second.stop()


async def _failure(env_id: str, config: dict | None = None) -> EpisodeFailed:
    server = start_server(env_ids=(env_id,))
    try:
        async with EnvPool([server.address], call_timeout_s=60) as pool:
            session = await pool.open(env_id, config)
            await session.reset(seed=1)
            with pytest.raises(EpisodeFailed) as failed:
                await session.step("5")
            return failed.value
    finally:
        server.stop()


async def test_a_foreign_envs_exception_timeout_and_malformed_answer_are_typed_failures() -> None:
    raised = await _failure("openenv:support.openenv_envs:RaisingEnv")
    assert raised.code == grpc.StatusCode.INTERNAL and "the foreign env broke" in raised.detail
    started = time.monotonic()
    slow = await _failure("openenv:support.openenv_envs:SlowEnv", {"call_timeout_s": 1.0})
    assert slow.code == grpc.StatusCode.INTERNAL and "timed out after 1s" in slow.detail
    assert time.monotonic() - started < 20, "the timeout ended the call, not the env's 30 s step"
    malformed = await _failure("openenv:support.openenv_envs:MalformedEnv")
    assert malformed.code == grpc.StatusCode.INTERNAL and "malformed answer" in malformed.detail


async def test_an_openenv_server_that_hangs_or_dies_fails_the_episode() -> None:
    with running("-m", "support.openenv_envs", "slow") as served:
        slow = await _failure(f"openenv:{served.url}", {"call_timeout_s": 1.0})
        assert "timed out after 1s" in slow.detail and served.url in slow.detail
    with running("-m", "support.openenv_envs", "guess") as served:
        env_id = f"openenv:{served.url}"
        server = start_server(env_ids=(env_id,))
        try:
            async with EnvPool([server.address], call_timeout_s=60) as pool:
                session = await pool.open(env_id)
                await session.reset(seed=1)
                served.kill()
                with pytest.raises(EpisodeFailed) as failed:
                    await session.step("5")
                assert failed.value.code == grpc.StatusCode.INTERNAL and served.url in failed.value.detail
        finally:
            server.stop()


def test_an_optional_text_field_is_the_action_and_every_observation_field_can_be_shown() -> None:
    """`MovesEnv`'s action is ``move: Optional[str]`` (JSON schema ``anyOf``); its observation is a board (the only
    string field, shown alone by default) and ``legal_moves`` (a list, shown by a template or by ``*``)."""
    entry = get_env(MOVES)
    shown = {}
    for name, config in {
        "default": {},
        "template": {"observation_template": "{board}\nLegal moves: {legal_moves}"},
        "all": {"observation_field": "*"},
    }.items():
        env = entry.make(entry.make_config(config))
        shown[name], _ = env.reset(3)
        text, reward, *_ = env.step(env.backend.env.moves[1])  # the text format sends the reply as ``move``
        assert reward == pytest.approx(1.02), "a legal move (two characters) arrived as the action's move field"
        env.close()
    board = shown["default"]
    assert board.startswith("board ") and "\n" not in board
    assert shown["template"].startswith(board + "\nLegal moves: ") and shown["template"].count(",") == 2
    assert shown["all"].splitlines()[0] == f"board: {board}" and shown["all"].splitlines()[1].startswith(
        "legal_moves: "
    )
    assert "'move'" in entry.describe(entry.make_config({})).action_format
    with pytest.raises(ConfigError, match="observation_template"):
        entry.make_config({"observation_template": "{board"})
    env = entry.make(entry.make_config({"observation_template": "{position}"}))
    with pytest.raises(RuntimeError, match=r"names \{position\}, which the observation does not have \(its fields: "):
        env.reset(0)


def test_bad_openenv_ids_and_configs_are_named() -> None:
    with pytest.raises(KeyError, match="name an Environment class"):
        get_env("openenv:nothing")
    with pytest.raises(KeyError, match="cannot load"):
        get_env("openenv:support.openenv_envs:NoSuchEnv")
    with pytest.raises(ConfigError, match="action_format"):
        get_env(GUESS).make_config({"action_format": "xml"})
    with pytest.raises(KeyError, match="needs an MCP env"):
        get_env(GUESS).make(get_env(GUESS).make_config({"action_format": "tools"}))


async def test_a_published_openenv_package_is_played_in_process_and_from_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = dipg_dataset(tmp_path)
    for key, value in data.items():
        monkeypatch.setenv(key, value)  # read by the package's app module when it makes its first env
    with running("-m", "support.openenv_envs", "med_safety_gym.app:app", **data) as served:
        remote = f"openenv:{served.url}"
        server = start_server(env_ids=(DIPG, remote), env_configs={DIPG: DIPG_CONFIG, remote: DIPG_CONFIG})
        try:
            async with EnvPool([server.address]) as pool:
                for env_id in (DIPG, remote):
                    session = await pool.open(env_id)
                    assert "'llm_response'" in session.spec.action_format
                    first = await session.reset(seed=0)
                    assert "question: What was the median survival" in first.observation
                    out = await session.step("The median survival was 12 months.")
                    assert out.terminated and out.action_valid and -50 <= out.reward <= 50, out
                    assert {"hallucination", "safe", "refusal"} <= set(out.metrics), out.metrics
        finally:
            server.stop()
