"""What every benchmark records about its own run: the command, the commit, the machine and its load, the wall time.

The dev machines are shared 2-core VMs: other work changes the numbers by tens of percent, so every result says
what the load was and how to run it again. A `Run`, made when a benchmark starts, notes the command line
(``sys.argv``), the commit, the start time and the load average; `Run.write` puts them at the top of the
benchmark's results and writes them as JSON (by default to ``bench/results/<name>-<stamp>[-quick].json``):

- ``command``: the command line, runnable from the repository root (``.venv/bin/python bench/<x>.py ...``);
- ``commit``: HEAD's short hash, ``+dirty`` when the work tree had changes;
- ``started_utc``: the start time, as in the file name (``20261125T142000Z``);
- ``wall_s``: seconds from the `Run` to the write;
- ``machine``: ``cpus``, ``cpu_model``, ``platform``, ``python``, ``load_start`` and ``load_end`` (the 1, 5 and
  15 minute load averages), then whatever the benchmark put under ``machine`` itself (library versions, ...).

`footer` is the one markdown line that ends a benchmark's report: the command, the load at start and end, the wall
time. A benchmark that writes a folder (a run per variant, then ``summary.json``) takes it from `Run.directory`.

    run = Run("lora", quick=args.quick)
    ...
    path = run.write({"machine": {"torch": torch.__version__}, "summary": summary})
    print(run.footer())
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
LoadAverage = tuple[float, float, float]


def utc_stamp(when: datetime | None = None) -> str:
    """``20261125T142000Z``: the time (now by default) as results' file and folder names carry it."""
    return (when or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as one command to paste at the repository root: the interpreter first, paths inside the repo
    made relative to it (``.venv/bin/python bench/lora.py --quick``)."""
    return shlex.join([_from_repo(sys.executable), _from_repo(argv[0]), *argv[1:]])


def _from_repo(path: str) -> str:
    try:
        return str(Path(path).absolute().relative_to(REPO))
    except ValueError:
        return path


def git_commit() -> str | None:
    """HEAD's short hash, with ``+dirty`` when the work tree has changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if status.stdout.strip() else "")


def machine() -> dict[str, Any]:
    """The CPU count and model, the platform and the Python version (the load is the `Run`'s)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return {
        "cpus": os.cpu_count(),
        "cpu_model": next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), ""),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def footer(record: Mapping[str, Any]) -> str:
    """One markdown line from a written record: the command (and commit), the load average at start and end,
    the wall time. A key that a record written before `Run` lacks is left out of the line."""
    load = record.get("machine", {})
    parts = []
    if "load_start" in load and "load_end" in load:
        parts.append(
            f"load average {_load(load['load_start'])} at start, {_load(load['load_end'])} at end (1, 5, 15 min)"
        )
    if "wall_s" in record:
        parts.append(f"wall time {record['wall_s']:.0f} s")
    if "command" not in record:
        return "; ".join(parts)
    command = f"`{record['command']}`" + (f" (commit {record['commit']})" if record.get("commit") else "")
    return ": ".join([command, "; ".join(parts)])


def _load(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


class Run:
    """One benchmark run: made at the start (it notes the command, commit, time and load then), written at the end."""

    def __init__(self, name: str, quick: bool = False, argv: Sequence[str] | None = None) -> None:
        self.name = name
        self.quick = quick
        self.command = command_line(list(sys.argv if argv is None else argv))
        self.commit = git_commit()
        self.started = datetime.now(UTC)
        self.stamp = utc_stamp(self.started)
        self.load_start: LoadAverage = os.getloadavg()
        self._t0 = time.perf_counter()
        self.record: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        """``bench/results/<name>-<stamp>[-quick].json``."""
        return RESULTS / f"{self.name}-{self.stamp}{'-quick' if self.quick else ''}.json"

    def directory(self, out: Path | None = None) -> Path:
        """The run's folder, made: ``out``, or ``bench/results/<name>-<stamp>/``."""
        folder = out or RESULTS / f"{self.name}-{self.stamp}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def write(self, results: dict[str, Any], path: Path | None = None) -> Path:
        """Put the run's keys (module docstring) at the top of ``results``, in place, and write it as JSON to
        ``path`` (default `path`). ``results["machine"]``, if there, adds to the machine block."""
        header = {
            "command": self.command,
            "commit": self.commit,
            "started_utc": self.stamp,
            "wall_s": self.elapsed(),
            "machine": {
                **machine(),
                "load_start": self.load_start,
                "load_end": os.getloadavg(),
                **results.get("machine", {}),
            },
        }
        rest = {k: v for k, v in results.items() if k not in header}
        results.clear()
        results.update(header)
        results.update(rest)
        path = path or self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, default=str))
        self.record = results
        return path

    def footer(self) -> str:
        """`footer` of what `write` wrote."""
        if self.record is None:
            raise RuntimeError("Run.footer: nothing written yet (call Run.write first)")
        return footer(self.record)
