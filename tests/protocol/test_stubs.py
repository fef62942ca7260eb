"""The committed Python stubs are what protoc makes of the committed .proto."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_stubs_match_the_proto():
    run = subprocess.run([sys.executable, "protos/generate.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr + run.stdout
