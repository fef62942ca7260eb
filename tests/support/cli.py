"""Running ``python -m roll_lightning`` as users do, a process of its own, the tiny model cached in the test's folder.

- `cli_env`: the environment (model cache under ``tmp``, one OpenMP thread, ``tests/`` importable so
  ``--import support.plugin_envs`` and ``-m support.*`` work).
- `run_cli`: run it to the end, in a process forked with the CLI's imports done (`support.preimported`: ~6 s of
  CPU less per run); `run_cli_fresh`: the same in a new interpreter; `start_cli`: start a new interpreter (to
  signal it), optionally in its own session so a test can signal its whole process group, as a terminal's Ctrl-C
  does.
- `fit_tiny`: ``fit`` on ``configs/tiny.yaml`` plus a test's config, logging CSV under ``tmp/run``;
  `logged_metrics`: every metric that run logged, its last value.
- `build_cli`: the CLI's objects in this process, not run (what the parser and its links made);
- `wait_for_file`: wait (a hang guard, not a timing) until a run wrote a file or exited.
- `SLOW_ENV`: arguments that make each env step take 0.5 s (a rollout long enough to be interrupted);
  `slow_env(marks)` the same, each env step leaving a file in ``marks``, and `wait_inside_the_second_rollout`.
- `dumped_groups`: the groups each step trained on, from `TrajectoryDump`'s files (resume checks);
  `check_stopped_mid_rollout_then_resume`: the resume check after a signal stopped step 2's rollout.
- `SPARSE_CHECKPOINTS`: a `StepCheckpoint` due every 100 steps; `run_summary`: the end-of-run block;
  `check_last_holds_the_last_step`: a run's only checkpoint holds the step it ended after, and the block says so.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = ROOT / "tests"
TINY = str(ROOT / "configs" / "tiny.yaml")

TWO_RANKS = [  # two FSDP2 ranks on the CPU (gloo), as a user would ask for them on the command line
    "--trainer.devices", "2",
    "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
    "--trainer.strategy.data_parallel_size", "2", "--trainer.strategy.tensor_parallel_size", "1",
    "--trainer.strategy.process_group_backend", "gloo",
]  # fmt: skip

_SLOW = {"max_steps": 2, "delay_s": 0.5}
SLOW_ENV = [
    "--data.envs.local_args", '["--import", "support.plugin_envs"]', "--data.rollout.env_id", "slow",
    "--data.rollout.env_config", json.dumps(_SLOW),
]  # fmt: skip


SPARSE_CHECKPOINTS = [  # a config's own checkpoint callback, due at no step of a short run
    "--trainer.callbacks+=roll_lightning.checkpoints.StepCheckpoint", "--trainer.callbacks.every_n_train_steps=100",
]  # fmt: skip


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "ROLL_LIGHTNING_CACHE": str(tmp / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": path,
        **extra,
    }


def run_cli(
    *args: str, cwd: Path, timeout: int = 600, module: str = "roll_lightning", **env: str
) -> subprocess.CompletedProcess[str]:
    """``python -m <module> <args>`` in ``cwd`` to the end (``module`` may be a wrapper in ``tests/support``), in a
    process that starts with the CLI's imports done (`support.preimported`)."""
    from support import preimported

    return preimported.run(module, list(args), cwd=cwd, env=cli_env(cwd, **env), timeout=timeout)


def run_cli_fresh(
    *args: str, cwd: Path, timeout: int = 600, module: str = "roll_lightning", **env: str
) -> subprocess.CompletedProcess[str]:
    """`run_cli` in a new interpreter, imports and all, exactly as a user's shell starts it."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=cli_env(cwd, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def fit_tiny(tmp_path: Path, extra: str, steps: int, *more: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``fit --config configs/tiny.yaml --config <extra>`` for ``steps`` rollout steps, metrics as CSV in
    ``tmp_path/run`` (``more``: further command-line settings; ``env``: environment variables)."""
    root = tmp_path / "run"
    return run_cli(
        "fit", "--config", TINY, "--config", extra, "--model.rollout_steps", str(steps),
        "--trainer.default_root_dir", str(root), "--trainer.logger", "CSVLogger",
        "--trainer.logger.save_dir", str(root), *more, cwd=tmp_path, **env,
    )  # fmt: skip


def logged_metrics(root: Path) -> dict[str, float]:
    """The last value of every metric the run under ``root`` logged (its first version's ``metrics.csv``)."""
    (metrics,) = root.glob("lightning_logs/version_0/metrics.csv")
    return {k: float(v) for row in csv.DictReader(metrics.open()) for k, v in row.items() if v}


# A terminal's foreground job has SIGINT at its default, whatever the test runner inherited: a runner started in
# the background (`cmd &` in a script) has SIGINT ignored, its children too, and roll_lightning rightly leaves an
# ignored SIGINT ignored (`exits.sigint_as_sigterm`), so a Ctrl-C test would wait in vain.
AS_IN_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('roll_lightning', run_name='__main__', alter_sys=True)"
)


def start_cli(*args: str, cwd: Path, own_session: bool = False, capture_stdout: bool = False) -> subprocess.Popen[str]:
    """Start ``python -m roll_lightning <args>`` with its stderr piped (``own_session``: its own process group,
    SIGINT at its default, as a job in a terminal; ``capture_stdout``: stdout piped too, for a test that reads it
    with ``communicate``)."""
    command = ["-c", AS_IN_A_TERMINAL] if own_session else ["-m", "roll_lightning"]
    return subprocess.Popen(
        [sys.executable, *command, *args],
        cwd=cwd,
        env=cli_env(cwd),
        stdout=subprocess.PIPE if capture_stdout else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_session,
    )


def slow_env(marks: Path) -> list[str]:
    """`SLOW_ENV` whose env steps each leave a file in ``marks`` as they start (`wait_inside_the_second_rollout`)."""
    return [*SLOW_ENV[:-1], json.dumps({**_SLOW, "mark_dir": str(marks)})]


def wait_inside_the_second_rollout(run: Path, marks: Path, proc: subprocess.Popen[str]) -> bool:
    """Until step 1 is trained (its trajectory file is written) and an env step of the next rollout has started
    (a new file in ``marks``, `slow_env`): a signal now lands inside that rollout, however loaded the machine.
    False if ``proc`` exited first."""
    if not wait_for_file(run, "step_000001.jsonl", proc):
        return False
    seen = set(marks.iterdir()) if marks.is_dir() else set()
    for _ in range(30_000):  # a hang guard, not a timing: pytest-timeout bounds the test
        if marks.is_dir() and set(marks.iterdir()) - seen:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def wait_for_file(root: Path, pattern: str, proc: subprocess.Popen[str]) -> bool:
    """Until a file matching ``pattern`` exists under ``root`` (True) or ``proc`` exited (False)."""
    for _ in range(30_000):  # a hang guard, not a timing: pytest-timeout bounds the test
        if list(root.rglob(pattern)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    return False


def children(pid: int) -> set[int]:
    """The process ids of ``pid``'s direct children (its local env servers)."""
    return {int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()}


def jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file, split on newlines only: ``str.splitlines`` would also split on U+2028 and
    the like, which a dump written with ``ensure_ascii=False`` keeps raw inside a model's text."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def dumped_episodes(root: Path) -> list[dict]:
    """Every episode record of ``TrajectoryDump``'s ``step_*.jsonl`` files under ``root``."""
    return [record for path in root.rglob("step_*.jsonl") for record in jsonl(path)]


def dumped_groups(root: Path) -> dict[int, list[str]]:
    """Step number -> the sorted group ids of that step's episodes (``TrajectoryDump``'s ``step_*.jsonl``)."""
    return {int(p.stem.split("_")[1]): sorted({e["group"] for e in jsonl(p)}) for p in root.rglob("step_*.jsonl")}


def check_stopped_mid_rollout_then_resume(run: Path, args: list[str], steps: int, cwd: Path) -> None:
    """A run stopped during step 2's rollout: its checkpoint is step 1 (step 2 was neither trained on nor saved);
    resuming with ``args`` and ``--ckpt_path last`` plays every group of the ``steps`` steps once (2 per step)."""
    import torch

    done_steps = torch.load(next(run.rglob("last.ckpt")), weights_only=False)["rollout_steps"]
    assert done_steps == 1 == len(dumped_groups(run))
    resumed = run_cli(*args, "--ckpt_path", "last", cwd=cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    groups = dumped_groups(run)
    assert sorted(groups) == list(range(1, steps + 1))
    played = [g for step in sorted(groups) for g in groups[step]]
    assert len(played) == len(set(played)) == steps * 2  # every group once: none repeated, none skipped


def run_summary(stdout: str) -> tuple[int, dict[str, str]]:
    """The end-of-run block `RunSummary` printed last: the rollout steps its head counts, and its rows by name."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("run: "))
    head = re.match(r"run: \S+ \((\d+) rollout steps in ", lines[start])
    assert head is not None, lines[start]
    rows = dict(line.split(None, 1) for line in lines[start + 1 :] if line.startswith("  "))
    return int(head[1]), rows


def check_last_holds_the_last_step(run: Path, stdout: str, alone: bool = True) -> int:
    """``last.ckpt``, whole (and, if ``alone``, the only checkpoint under ``run``), holds the last step the run
    trained (the summary's count, each step's dumped episodes) and the summary's checkpoint row names it; returns
    the step."""
    import torch

    from roll_lightning.checkpoints import verify

    steps, rows = run_summary(stdout)
    last = run / "checkpoints" / "last.ckpt"
    stamp = verify(last)
    assert not alone or sorted(p.name for p in run.rglob("*.ckpt")) == ["last.ckpt"]
    assert stamp is not None and stamp.rollout_step == steps == len(dumped_groups(run)) >= 1, (stamp, steps)
    assert torch.load(last, weights_only=False)["rollout_steps"] == steps
    assert rows["checkpoint"].endswith(f"checkpoints/last.ckpt (after rollout step {steps})"), rows
    return steps


def build_cli(tmp_path: Path, monkeypatch: Any, *args: str) -> Any:
    """`RollLightningCLI` on ``configs/tiny.yaml`` plus ``args``, built but not run: its model, data and trainer."""
    from roll_lightning.cli import RollLightningCLI
    from roll_lightning.rollout.datamodule import RolloutDataModule
    from roll_lightning.training.module import AgentRLModule

    monkeypatch.setenv("ROLL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    return RollLightningCLI(
        AgentRLModule,
        RolloutDataModule,
        args=["--config", TINY, "--trainer.logger", "false", *args],
        run=False,
        parser_kwargs={"parser_mode": "omegaconf+"},
    )
