"""Ctrl-C (SIGINT) stops ``fit`` the way SIGTERM does: exit 130, nothing half done, and the run resumes.

Before, Lightning turned the `KeyboardInterrupt` into exit status 1, the rollout's task was left on a closed
event loop ("Task was destroyed but it is pending!"), and nothing said how to resume.
"""

from __future__ import annotations

import importlib.abc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import (
    TINY,
    check_stopped_mid_rollout_then_resume,
    children,
    slow_env,
    start_cli,
    wait_inside_the_second_rollout,
)

from roll_lightning.__main__ import entry
from roll_lightning.exits import sigint_as_sigterm

STEPS = 4
ARGS = [
    "--config", TINY, "--model.rollout_steps", str(STEPS), "--trainer.logger", "false",
    "--trainer.callbacks+=roll_lightning.callbacks.TrajectoryDump", "--trainer.callbacks.every_n_steps", "1",
    "--trainer.callbacks.max_episodes", "0",
]  # fmt: skip


def test_ctrl_c_abandons_the_rollout_exits_130_and_resume_plays_its_groups(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it (the local env server gets it too),
    while a slow rollout is in flight."""
    run, marks = tmp_path / "run", tmp_path / "env_steps"
    args = ["fit", *ARGS, *slow_env(marks), "--trainer.default_root_dir", str(run)]
    proc = start_cli(*args, cwd=tmp_path, own_session=True, capture_stdout=True)
    try:
        assert wait_inside_the_second_rollout(run, marks, proc), "the run ended before its second rollout"
        servers = children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert "SIGINT: abandoned the rollout in flight" in stderr, stderr[-3000:]
    assert stderr.rstrip().endswith("roll_lightning: stopped by SIGINT; resume with --ckpt_path last"), stderr[-3000:]
    for noise in ("Task was destroyed", "Traceback", "KeyboardInterrupt"):
        assert noise not in stderr, stderr[-3000:]
    # The summary says it stopped, after which step, and how to carry on.
    assert "rollout steps in" in stdout and ", stopped)" in stdout, stdout[-2000:]
    assert any(line.split()[:1] == ["resume"] and line.endswith("--ckpt_path last") for line in stdout.splitlines())
    assert servers and not any(Path(f"/proc/{pid}").exists() for pid in servers)  # the env server was stopped
    check_stopped_mid_rollout_then_resume(run, args, STEPS, tmp_path)


@pytest.fixture
def sigint_at_its_default() -> Iterator[None]:
    """SIGINT as a terminal's job has it, even when this test runner was started with SIGINT ignored (`cmd &`)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_at_its_default")
def test_sigint_goes_to_the_sigterm_handler_or_interrupts_when_there_is_none() -> None:
    """In-process: with a SIGTERM handler (a run's), SIGINT is handed to it; with none (parsing, loading), it is a
    KeyboardInterrupt. Outside the block, SIGINT's handler is what it was."""
    before = signal.getsignal(signal.SIGINT)
    seen: list[int] = []
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with sigint_as_sigterm() as received:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0)  # the handler runs at the next bytecode boundary
        assert seen == [signal.SIGINT] and received == [signal.SIGINT]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with pytest.raises(KeyboardInterrupt), sigint_as_sigterm():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    assert signal.getsignal(signal.SIGINT) == before


def test_an_ignored_sigint_stays_ignored() -> None:
    """``nohup`` or a background job (``cmd &``) starts us with SIGINT ignored: a run keeps ignoring it."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigint_as_sigterm() as received:
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0)
        assert received == [] and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


class _CtrlCDuringImport(importlib.abc.MetaPathFinder):
    """A fake, named so: Ctrl-C while ``roll_lightning.cli`` imports torch and Lightning (seconds, in real runs)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "roll_lightning.cli":
            raise KeyboardInterrupt


def test_ctrl_c_while_the_cli_still_imports_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "roll_lightning.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_CtrlCDuringImport(), *sys.meta_path])
    with pytest.raises(SystemExit) as stop:
        entry()
    assert stop.value.code == 128 + signal.SIGINT
    assert capsys.readouterr().err == "roll_lightning: stopped by SIGINT; resume with --ckpt_path last\n"


HELD_EXIT = """
import signal, sys, threading
from roll_lightning.exits import exit_within

threading.Thread(target=threading.Event().wait, name="stuck-on-a-closed-loop").start()  # never ends, not a daemon
exit_within(128 + signal.SIGTERM, grace_s=float(sys.argv[1]))
sys.exit(128 + signal.SIGTERM)
"""


def test_an_exit_held_by_a_stuck_thread_ends_with_the_status_and_names_the_thread(tmp_path: Path) -> None:
    """Interpreter exit waits for every non-daemon thread; a stopped run must end anyway (seen once in the chaos
    drill: a trainer that printed "stopped by SIGTERM" and then waited for a thread until it was killed)."""
    proc = subprocess.run(
        [sys.executable, "-c", HELD_EXIT, "0.5"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert "held by threads ['stuck-on-a-closed-loop']; ending with status 143" in proc.stderr
    assert "in wait" in proc.stderr  # the stuck thread's stack
