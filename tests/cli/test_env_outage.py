"""`fit` against a remote env server that freezes for 5 s mid-run: the run waits the outage out and finishes.

The issue's reproduction as a test: before the fix this run printed "readmitting it" and then never trained
another step, at 0% CPU (leaked episode slots left the rollout with nothing running and nothing to wake it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from roll_lightning.envs.local import launch_local_server

ROOT = Path(__file__).parent.parent.parent
STEPS = 5


def test_fit_waits_out_a_short_outage_of_its_only_env_server(tmp_path: Path) -> None:
    server = launch_local_server(["sokoban", "frozenlake"])
    run = tmp_path / "run"
    args = [
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--model.rollout_steps", str(STEPS),
        "--data.envs.endpoints", f'["{server.address}"]', "--data.rollout.concurrent_episodes", "8",
        "--trainer.default_root_dir", str(run),
    ]  # fmt: skip
    env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "roll_lightning", *args], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        for _ in range(30_000):  # until the first step is trained (a hang guard, not a timing)
            if list(run.rglob("step_000001.jsonl")) or proc.poll() is not None:
                break
            time.sleep(0.02)
        os.kill(server.process.pid, signal.SIGSTOP)
        time.sleep(5.0)
        os.kill(server.process.pid, signal.SIGCONT)
        _, stderr = proc.communicate(timeout=540)
    finally:
        proc.kill()
        os.kill(server.process.pid, signal.SIGCONT)
        server.stop()
    assert proc.returncode == 0, stderr[-3000:]
    assert "ejecting env endpoint" in stderr and "readmitting it" in stderr, "the outage happened during the run"
    last = torch.load(next(run.rglob("last.ckpt")), weights_only=False)
    assert last["rollout_steps"] == STEPS
