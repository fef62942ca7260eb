"""Every way a foreign env can be unreachable or wrong ends the command in one line naming the cause, exit status
2, no traceback: a dead OpenEnv URL and a URL serving something else (for `describe`, `serve`, `openenv` and
`fit`), a port already in use (`serve`, `openenv`), and a launched server that does not start in time
(`conformance --launch`)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.cli import fit_tiny

from env_servers.ports import free_port


@pytest.fixture(scope="module")
def not_openenv() -> Iterator[str]:
    """A real HTTP server that is not an OpenEnv server (Python's file server: 404 on /schema)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def port_in_use() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def env_servers(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """``python -m env_servers <command>`` for each command, all at once (each spends seconds importing)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "env_servers", *c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for c in commands
    ]
    return [subprocess.CompletedProcess(p.args, p.wait(timeout=120), *p.communicate()) for p in procs]


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command's only stderr line, after checking its exit status (2) and that nothing else was printed."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, f"{done.args}: {done.stderr[-3000:]}"
    return lines[0]


def test_a_dead_url_or_one_serving_something_else_is_one_line(not_openenv: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    commands = [[command, f"openenv:{url}", *(["--port", "0"] if command != "describe" else [])]
                for url in (dead, not_openenv) for command in ("describe", "serve", "openenv")]  # fmt: skip
    said = [one_line(done) for done in env_servers(*commands)]
    refused = (
        f"error: OpenEnv server {dead}: cannot connect ([Errno 111] Connection refused); is the server running there?"
    )
    assert said == [refused] * 3 + [f"error: {not_openenv} is not an OpenEnv server: GET /schema answered 404"] * 3


def test_a_port_in_use_is_one_line_naming_it(port_in_use: int) -> None:
    said = [
        one_line(done)
        for done in env_servers(*([c, "frozenlake", "--port", str(port_in_use)] for c in ("serve", "openenv")))
    ]
    assert said == [f"error: cannot listen on 127.0.0.1:{port_in_use}: Address already in use"] * 2


def test_conformance_on_a_launched_server_that_cannot_reach_its_env_quotes_the_reason() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    serve = f"{sys.executable} -m env_servers serve openenv:{dead} --port {{port}}"
    (done,) = env_servers(["conformance", "--env", f"openenv:{dead}", "--launch", serve])
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "the launched server exited with code 2 before serving" in done.stdout, done.stdout
    assert f"error: OpenEnv server {dead}: cannot connect ([Errno 111] Connection refused)" in done.stdout, done.stdout


def test_a_launched_server_that_does_not_start_in_time_is_named_so() -> None:
    """Not "Connection refused": the start-up limit is the cause, and the line says how to raise it."""
    (done,) = env_servers(["conformance", "--env", "frozenlake", "--launch", "sleep 30", "--launch-timeout", "2"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "did not report SERVING within 2s" in done.stdout and "--launch-timeout" in done.stdout, done.stdout


def test_fit_on_a_dead_openenv_url_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    extra = tmp_path / "dead.yaml"
    extra.write_text(yaml.safe_dump({"data": {"rollout": {"env_id": f"openenv:{url}"}}}))
    done = fit_tiny(tmp_path, str(extra), 1)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"roll_lightning: error: data.rollout.env_id='openenv:{url}': the local env server did not start: "
        f"OpenEnv server {url}: cannot connect ([Errno 111] Connection refused); is the server running there?"
    ), last
