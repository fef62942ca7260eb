"""`python -m roll_lightning.env_client play`, run as users run it: random episodes through local env servers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_play_random_episodes_through_local_servers():
    done = run("-m", "roll_lightning.env_client", "play", "sokoban", "--episodes", "6", "--config", '{"max_steps": 15}')
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("seed")]
    assert len(lines) == 6 and "6 episodes" in done.stdout and "success" in done.stdout
