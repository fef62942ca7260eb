"""The chaos benchmark's CI version (`bench/chaos.py --quick`): three env servers and a `fit` through each fault
once, 20 s apart (the trainer stopped and resumed, then a server killed and restarted, one frozen, all frozen:
the resumed trainer meets every server fault); the run's own records show no group lost, none trained twice, and
no hang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support.cli import ROOT, cli_env


def test_a_run_through_each_fault_loses_and_doubles_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--quick", "--root", str(tmp_path / "run")],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    report = done.stdout[done.stdout.index("{") : done.stdout.rindex("}") + 1]
    verdict = json.loads(report)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert verdict["lost"] == 0 and verdict["doubled"] == 0 and verdict["ok"], verdict
    assert verdict["steps"] >= 5 and verdict["trainer_processes"] == 2, verdict  # the trainer was stopped, resumed
    assert set(verdict["faults"]) == {"kill-server", "stop-server", "stop-all", "term-trainer"}, verdict
    assert verdict["every_server_fault_seen"], verdict  # each server fault moved an env/ counter
