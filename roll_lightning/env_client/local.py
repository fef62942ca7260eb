"""Launch env servers as child processes on this machine (`EnvPool(endpoints="local")`).

A child gets SIGTERM when the launcher exits, even by a crash (the parent-death signal it arms given
``--parent-pid``), so a dead trainer never leaves servers behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class LocalServer:
    process: subprocess.Popen[str]
    address: str
    server_id: str
    log_path: str  # stderr goes to a file: a chatty server never blocks on a pipe

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (graceful drain), then SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


def launch_local_server(
    env_ids: Sequence[str],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 60.0,
    prefix: Sequence[str] = (),
) -> LocalServer:
    """Start one server and wait for its ready line (RuntimeError with its log on failure).

    ``prefix``: a command that execs the server, e.g. ``["ip", "netns", "exec", "host1"]``."""
    if not env_ids:
        raise ValueError("env_ids: name at least one env for the local server to serve")
    serve = [sys.executable, "-m", "env_servers", "serve", *env_ids, "--host", host, "--port", str(port)]
    serve += ["--parent-pid", str(os.getpid())]  # it stops when we die (no preexec_fn: unsafe with threads)
    cmd = [*prefix, *serve, *extra_args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log = tempfile.NamedTemporaryFile("w+", prefix="env-server-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("{"):
                info = json.loads(line)
                return LocalServer(proc, info["address"], info["server_id"], log.name)
        if proc.poll() is not None:
            break
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        problem = f"did not report ready within {ready_timeout_s:.0f}s"
    else:
        problem = f"exited with code {proc.returncode}"
    log.seek(0)
    said = log.read()
    last = said.strip().splitlines()[-1:] or [""]
    if last[0].startswith("error: "):  # the server's own one-line reason (bad env id, unreachable foreign env)
        raise RuntimeError(last[0].removeprefix("error: "))
    raise RuntimeError(f"local env server ({' '.join(cmd)}) {problem}:\n{said[-2000:]}")
