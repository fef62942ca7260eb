"""`fit` against a remote env server that freezes: a short outage is waited out and the run finishes; one longer
than ``data.envs.outage_timeout_s`` ends the run in one line, with every trained step checkpointed.

The first test is the issue's reproduction: before the fix this run printed "readmitting it" and then never
trained another step, at 0% CPU (leaked episode slots left the rollout with nothing running and nothing to wake
it).
"""

from __future__ import annotations

import csv as csv_module
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from support.cli import SPARSE_CHECKPOINTS, TINY, check_last_holds_the_last_step, run_cli, start_cli, wait_for_file

from env_servers.ports import free_port
from roll_lightning.env_client.local import LocalServer, launch_local_server

STEPS = 5


@contextmanager
def remote_server(*env_ids: str) -> Iterator[LocalServer]:
    """A real env server the run reaches by address (not one it starts itself), resumed and stopped at the end."""
    server = launch_local_server(list(env_ids))
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()


def fit(server: LocalServer, run: Path, *args: str, capture_stdout: bool = False) -> subprocess.Popen[str]:
    return start_cli(
        "fit", "--config", TINY, "--data.envs.endpoints", f'["{server.address}"]',
        "--trainer.default_root_dir", str(run), *args, cwd=run.parent, capture_stdout=capture_stdout,
    )  # fmt: skip


def test_fit_waits_out_a_short_outage_of_its_only_env_server(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with remote_server("sokoban", "frozenlake") as server:
        proc = fit(server, run, "--model.rollout_steps", str(STEPS), "--data.rollout.concurrent_episodes", "8")
        try:
            wait_for_file(run, "step_000001.jsonl", proc)  # the first step is trained
            os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(5.0)
            os.kill(server.process.pid, signal.SIGCONT)
            _, stderr = proc.communicate(timeout=540)
        finally:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "ejecting env endpoint" in stderr and "readmitting it" in stderr, "the outage happened during the run"
    last = torch.load(next(run.rglob("last.ckpt")), weights_only=False)
    assert last["rollout_steps"] == STEPS


def test_an_outage_longer_than_the_timeout_ends_the_run_in_one_line_with_its_steps_kept(tmp_path: Path) -> None:
    """The only env server stops answering for good: the run waits ``outage_timeout_s``, then ends with one line
    that names the endpoint and the way back, status 1, the checkpoint of every step trained before (written at
    the stop: the config's is due every 100 steps), and the outage's fault counts in the metrics."""
    run = tmp_path / "run"
    with remote_server("frozenlake") as server:
        csv = ("--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(run))
        args = ("--model.rollout_steps", "50", "--data.envs.outage_timeout_s", "2", *csv, *SPARSE_CHECKPOINTS)
        proc = fit(server, run, *args, capture_stdout=True)
        try:
            wait_for_file(run, "step_000001.jsonl", proc)  # a step is trained
            os.kill(server.process.pid, signal.SIGSTOP)  # and never resumed during the run
            stdout, stderr = proc.communicate(timeout=540)
        finally:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith("roll_lightning: error: every env endpoint has been down for "), stderr[-3000:]
    assert server.address in last_line and "data.envs.outage_timeout_s" in last_line
    assert last_line.endswith("resume with --ckpt_path last once the envs are back") and "Traceback" not in stderr
    check_last_holds_the_last_step(run, stdout)  # whole, its bytes match its stamp, the step the summary names
    rows = list(csv_module.DictReader(next(run.rglob("metrics.csv")).open()))
    logged = {k: float(v) for row in rows for k, v in row.items() if v}  # the last value of each
    assert logged["env/ejections_total"] >= 1, "the outage's fault counts reach the metrics though no step followed"


def test_a_run_whose_endpoint_never_answers_stops_after_its_start_timeout_in_one_line(tmp_path: Path) -> None:
    """Nothing listens at the endpoint: the start waits ``data.envs.start_timeout_s`` (1 s here, 30 by default)
    for it to serve, then the run stops with one line naming it and the key that sets the wait, before any model
    is trained."""
    dead = f"127.0.0.1:{free_port()}"
    done = run_cli(
        "fit", "--config", TINY, "--data.envs.endpoints", f'["{dead}"]', "--data.envs.start_timeout_s", "1",
        "--trainer.default_root_dir", str(tmp_path / "run"), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == (
        f"roll_lightning: error: data.envs.endpoints=['{dead}']: nothing there was reachable and serving after 1s"
        " (data.envs.start_timeout_s): check that a server runs at that address, or raise the timeout if it needs"
        " longer to start"
    ), done.stderr[-3000:]
