"""Local env servers (`EnvPool(endpoints="local")`) never outlive the trainer that launched them, even when it is
killed: each server arms Linux's parent-death signal itself (``serve --parent-pid``), after exec. The launcher
used to arm it between fork and exec (``preexec_fn``), Python code in the child of a process with gRPC and torch
threads, which now and then crashed the server before it started (SIGSEGV, seen in CI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")

LAUNCHER = (
    "import time; from roll_lightning.env_client.local import launch_local_server; "
    "server = launch_local_server(['frozenlake']); print(server.process.pid, flush=True); time.sleep(600)"
)


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet (it has exited)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_killed_launcher_leaves_no_env_server_behind() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        server = int(launcher.stdout.readline())
        assert not gone(server)
        launcher.kill()  # SIGKILL: no cleanup of its own runs
        launcher.wait()
        for _ in range(3000):  # a hang guard, not a timing: the server drains (at most 10 s) and exits
            if gone(server):
                break
            time.sleep(0.01)
        assert gone(server)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_server_whose_parent_is_already_gone_stops_at_once() -> None:
    """``--parent-pid`` naming a process that is not (or no longer) our parent: the signal would never come."""
    command = [sys.executable, "-m", "env_servers", "serve", "frozenlake", "--port", "0", "--parent-pid", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]
    assert '"event": "serving"' not in done.stdout
