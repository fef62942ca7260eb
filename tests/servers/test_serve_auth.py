"""`python -m env_servers serve` with a token, run as users run it: a token source that yields no usable token is an
error (never a quiet fallback to no authentication), and refused calls cost the server next to no memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from roll_lightning.env_client.local import launch_local_server

ROOT = Path(__file__).resolve().parents[2]


def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "env_servers", "serve", "frozenlake", "--port", "0", *args]
    environ = {k: v for k, v in os.environ.items() if k != "ROLL_ENV_TOKEN"} | (env or {})
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


def token_file(tmp_path: Path, name: str, content: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("empty-file", "empty-token.txt"),
        ("blank-file", "blank-token.txt"),
        ("missing-file", "no-such-token.txt"),
        ("directory", "token-dir"),
        ("not-text", "binary-token.txt"),
        ("blank-flag", "--token"),
        ("blank-env", "ROLL_ENV_TOKEN"),
        ("both-flags", "--token or --token-file"),
    ],
)
def test_a_token_source_without_a_usable_token_is_an_error_naming_it(case: str, named: str, tmp_path: Path) -> None:
    """Before: an empty token file (or blank --token / ROLL_ENV_TOKEN) served with no authentication, silently."""
    (tmp_path / "token-dir").mkdir()
    args: list[str] = []
    env: dict[str, str] = {}
    if case == "empty-file":
        args = ["--token-file", token_file(tmp_path, named, b"\n")]
    elif case == "blank-file":
        args = ["--token-file", token_file(tmp_path, named, b"  \t\n\n")]
    elif case in ("missing-file", "directory"):
        args = ["--token-file", str(tmp_path / named)]
    elif case == "not-text":
        args = ["--token-file", token_file(tmp_path, named, b"\xff\xfe\x00")]
    elif case == "blank-flag":
        args = ["--token", "  "]
    elif case == "blank-env":
        env = {"ROLL_ENV_TOKEN": " \n"}
    else:
        args = ["--token", "a", "--token-file", token_file(tmp_path, "t.txt", b"b")]
    done = serve(*args, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "", "the server never started"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], done.stderr


@pytest.mark.parametrize("with_token", [True, False], ids=["token-file", "no-token"])
def test_the_ready_line_says_whether_a_token_is_required(with_token: bool, tmp_path: Path) -> None:
    path = token_file(tmp_path, "token.txt", b"s3cret\n")  # the trailing newline of `echo s3cret > token.txt`
    command = [sys.executable, "-m", "env_servers", "serve", "frozenlake", "--port", "0"]
    command += ["--token-file", path] if with_token else []
    environ = {k: v for k, v in os.environ.items() if k != "ROLL_ENV_TOKEN"}
    proc = subprocess.Popen(
        command, cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["token"] is with_token
        with grpc.insecure_channel(ready["address"]) as channel:
            info = channel.unary_unary("/roll_lightning.env.v1.EnvService/GetServerInfo")
            info(b"", metadata=(("authorization", "Bearer s3cret"),))  # the stripped file content is the token
    finally:
        proc.terminate()
        proc.wait()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_unauthenticated_large_requests_do_not_grow_the_server() -> None:
    """16 concurrent 15 MB unauthenticated Steps: refused on their headers, so their bodies are never buffered.
    Measured: before, the server went from 128 to 456 MB (526 MB peak) and kept it; now it grows by ~10 MB. The
    bound below is a third of what was sent, far from both, so a busy machine does not move the verdict."""
    server = launch_local_server(["frozenlake"], extra_args=["--token", "s3cret"])
    body = b"\x0a" + b"\xff" * 15_000_000
    codes: list[grpc.StatusCode] = []
    try:
        before = rss_bytes(server.process.pid)

        def send() -> None:
            options = [("grpc.max_send_message_length", 1 << 26)]
            with grpc.insecure_channel(server.address, options=options) as channel:
                step = channel.unary_unary("/roll_lightning.env.v1.EnvService/Step")
                try:
                    step(body)
                except grpc.RpcError as err:
                    codes.append(err.code())

        threads = [threading.Thread(target=send) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        grown = rss_bytes(server.process.pid) - before
    finally:
        server.stop()
    assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 16
    assert grown < 16 * len(body) / 3, f"the server grew by {grown / 2**20:.0f} MiB"
