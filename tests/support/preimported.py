"""``python -m roll_lightning ARGS`` in a fresh process that starts with the CLI's imports done.

A CLI process spends ~6 s of CPU importing torch, Lightning and transformers before it reads its first argument
(7-8 s on a 2-core AMD EPYC Zen 3 beside the suite): most of what an error-path test costs, and a few minutes of
the suite. `run` forks each run from a fork server (multiprocessing's ``forkserver``) that has imported
`roll_lightning.cli` once. The child is a process of its own, as a user's would be: its
environment, working folder, ``sys.argv`` and file descriptors 1 and 2 are the run's, ``roll_lightning`` runs as
``__main__``, and its exit status is the run's, after its threads and ``atexit`` handlers have finished, as at an
interpreter's exit. Tests that signal a run, or read its output as it goes, start a real interpreter
(`support.cli.start_cli`), and so do the recipes' learning runs.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_CONTEXT: Any = None


def _context() -> Any:
    """The fork server, started once with the CLI imported under the settings a test run's processes get: one
    OpenMP thread until a run sets its own, nothing from the model hub."""
    global _CONTEXT
    if _CONTEXT is None:
        from multiprocessing import forkserver

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["roll_lightning.cli"])
        saved = dict(os.environ)
        os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        try:
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _CONTEXT = context
    return _CONTEXT


def _exit_code(stop: SystemExit) -> int:
    """The interpreter's rule: None is 0, an int is itself, anything else is printed to stderr and is 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def _child(module: str, args: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    import atexit
    import runpy
    import threading

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["-m", *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads first, as at an interpreter's exit
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(
    module: str, args: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """What ``subprocess.run([python, -m, module, *args], capture_output=True, text=True)`` returns, the process
    forked with the CLI imported (raises `subprocess.TimeoutExpired` past ``timeout`` seconds, the run killed)."""
    command = [sys.executable, "-m", module, *args]
    with tempfile.TemporaryDirectory(prefix="cli-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        process = _context().Process(target=_child, args=(module, args, str(cwd), env, str(out), str(err)))
        process.start()
        process.join(timeout)
        timed_out = process.exitcode is None
        if timed_out:
            process.kill()
            process.join()
        stdout, stderr = (p.read_text(errors="replace") if p.exists() else "" for p in (out, err))
    if timed_out:
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    return subprocess.CompletedProcess(command, process.exitcode, stdout, stderr)
