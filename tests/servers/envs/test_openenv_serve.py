"""Our envs served as OpenEnv servers (``python -m env_servers openenv ENV``), checked with OpenEnv's own client
(`GenericEnvClient`) and its validation command (``openenv validate --url``): the same episodes as the env plays
here, tool calls and pictures, malformed replies, a step after the end; and our adapter on such a server passing
the conformance suite (OpenEnv both ways)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient
from support.conformance import conforms
from support.openenv_envs import Served, running
from support.servers import start_server

from env_servers.registry import get_env

MOVES = ["<answer>Right</answer>", "<answer>Down</answer>", "nonsense", "<answer>Left</answer>"]


@pytest.fixture(scope="module")
def frozenlake() -> Iterator[Served]:
    with running("-m", "env_servers", "openenv", "frozenlake", "--port", "0") as served:
        yield served


def test_openenvs_client_plays_the_episodes_our_env_plays(frozenlake: Served) -> None:
    entry = get_env("frozenlake")
    local = entry.make(entry.make_config({}))
    with GenericEnvClient(base_url=frozenlake.url).sync() as env:
        for seed in (3, 8):
            first = env.reset(seed=seed)
            text, _ = local.reset(seed)
            assert first.observation["text"] == text and first.observation["info"]["seed"] == seed
            assert first.reward is None and not first.done
            for move in MOVES:
                out = env.step({"text": move})
                want, reward, terminated, truncated, info = local.step(move)
                assert (
                    out.observation["text"] == want and out.reward == reward and out.done == (terminated or truncated)
                )
                assert out.observation["action_valid"] == info["action_valid"]
                assert out.observation["metrics"] == pytest.approx(info["metrics"])
                if out.done:
                    break
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"txt": "a misspelt field"})
        assert env.state()["step_count"] >= 1


def test_a_step_after_the_end_is_refused(frozenlake: Served) -> None:
    with GenericEnvClient(base_url=frozenlake.url).sync() as env:
        env.reset(seed=0)
        for _ in range(200):
            if env.step({"text": "<answer>Up</answer>"}).done:
                break
        with pytest.raises(RuntimeError, match="the episode is over"):
            env.step({"text": "<answer>Up</answer>"})


def test_openenvs_validation_command_passes(frozenlake: Served) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "validate", "--url", frozenlake.url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout[done.stdout.index("{") :])
    assert report["passed"] and {c["id"] for c in report["criteria"]} >= {"health_endpoint", "schema_endpoint"}
    assert report["mode"] == "production"


def test_http_reset_step_and_state_are_not_offered(frozenlake: Served) -> None:
    """OpenEnv's HTTP /step makes a fresh env per request, so it could never continue an episode: not served
    (404), and the docs say episodes run over /ws."""
    for method, path in (("POST", "/reset"), ("POST", "/step"), ("GET", "/state")):
        answer = httpx.request(method, frozenlake.url + path, json={"action": {"text": "Up"}}, timeout=30)
        assert answer.status_code in (404, 405), (path, answer.status_code, answer.text[:200])
    assert httpx.get(frozenlake.url + "/health", timeout=30).status_code == 200


def test_tool_calls_and_pictures_travel_through_openenv() -> None:
    with running("-m", "env_servers", "openenv", "lookup", "--port", "0") as served:
        with GenericEnvClient(base_url=served.url).sync() as env:
            first = env.reset(seed=4)
            box, code = first.observation["info"]["box"], first.observation["info"]["code"]
            calls = [{"id": "c1", "name": "lookup", "arguments": json.dumps({"box": box})}]
            out = env.step({"text": "", "tool_calls": calls})
            assert out.observation["tool_results"] == [
                {"call_id": "c1", "name": "lookup", "content": str(code), "is_error": False}
            ]
            bad = env.step({"tool_calls": [{"id": "c2", "name": "erase", "arguments": "{}"}]})
            assert bad.observation["tool_results"][0]["is_error"] and not bad.observation["action_valid"]
            done = env.step({"tool_calls": [{"id": "c3", "name": "answer", "arguments": json.dumps({"code": code})}]})
            assert done.done and done.reward == 1.0
    config = json.dumps({"render": "image"})
    with running("-m", "env_servers", "openenv", "frozenlake", "--port", "0", "--config", config) as served:
        with GenericEnvClient(base_url=served.url).sync() as env:
            first = env.reset(seed=1)
            (url,) = first.observation["images"]
            assert first.observation["text"].count("<image>") == 1
            assert base64.b64decode(url.split(",", 1)[1]).startswith(b"\x89PNG"), url[:40]


def test_our_adapter_on_our_openenv_server_passes_conformance(frozenlake: Served) -> None:
    env_id = f"openenv:{frozenlake.url}"
    server, second = start_server(env_ids=(env_id,)), start_server(env_ids=(env_id,))
    try:
        # garbage-reply passes only if action_valid crossed OpenEnv's wire as a field
        conforms(server.address, env_id, second=second.address, garbage="nonsense", passed=["garbage-reply"])
    finally:
        server.stop()
        second.stop()


def test_a_bad_env_or_config_stops_the_openenv_server_in_one_line() -> None:
    for args, expected in ((["no-such-env"], "unknown env id"), (["frozenlake", "--config", '{"size": "x"}'], "size")):
        done = subprocess.run(
            [sys.executable, "-m", "env_servers", "openenv", *args, "--port", "0"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert expected in done.stderr.strip().splitlines()[-1], done.stderr
