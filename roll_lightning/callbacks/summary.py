"""`RunSummary`: when a fit ends, or is stopped, say where everything went and how to go on.

Printed on rank 0 (also after Ctrl-C, SIGTERM or an error)::

    run: runs/sokoban (2677 rollout steps, 30.0 min)
      metrics      runs/sokoban/lightning_logs/version_0/metrics.csv
      checkpoint   runs/sokoban/checkpoints/last.ckpt (after rollout step 2677)
      resume       python -m roll_lightning fit --config configs/sokoban.yaml --ckpt_path last
      ...
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import lightning as L
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from roll_lightning.callbacks.progress import clock
from roll_lightning.checkpoints.callback import LAST, StepCheckpoint, checkpoint_dir, held_rollout_step
from roll_lightning.training.module import AgentRLModule


def rerun_command(subcommand: str, argv: Sequence[str], ckpt_path: str = "last") -> str:
    """``python -m roll_lightning <subcommand>`` with the run's arguments and ``--ckpt_path ckpt_path``."""
    args, skip = [], False
    for arg in list(argv)[1:]:  # argv[0] is the run's subcommand
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            args.append(arg)
    return shlex.join(["python", "-m", "roll_lightning", subcommand, *args, "--ckpt_path", ckpt_path])


def _shown(path: Path | str) -> str:
    """Relative to the working directory when below it (what a person types)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class RunSummary(L.Callback):
    def __init__(self, stream: IO[str] | None = None, argv: Sequence[str] | None = None) -> None:
        """Args:
        stream: where to write (default: stdout).
        argv: the CLI arguments after ``python -m roll_lightning`` (default: ``sys.argv[1:]``).
        """
        self._stream = stream
        self._argv = argv
        self._printed = self._training = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._printed = self._training = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = True  # a run that failed in setup has nothing to point at

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Lightning calls checkpoint callbacks last: the stop's checkpoint first (every rank), so the summary names it
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, StepCheckpoint):
                callback.on_exception(trainer, pl_module, exception)
        self.report(trainer, pl_module, stopped=True)

    def report(self, trainer: L.Trainer, pl_module: L.LightningModule, stopped: bool = False) -> None:
        if self._printed or not self._training or trainer.global_rank != 0:
            return
        self._printed = True
        stream = self._stream or sys.stdout
        stream.write("\n".join(self.lines(trainer, pl_module, stopped)) + "\n")
        stream.flush()

    def lines(self, trainer: L.Trainer, pl_module: L.LightningModule, stopped: bool) -> list[str]:
        argv = list(self._argv if self._argv is not None else sys.argv[1:])
        head = f"run: {_shown(trainer.default_root_dir)}"
        if isinstance(pl_module, AgentRLModule):
            seconds = time.perf_counter() - pl_module.fit_record.started
            head += f" ({pl_module.steps_done} rollout steps in {clock(seconds)}{', stopped' if stopped else ''})"
        rows: list[tuple[str, str]] = []
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                rows.append(("metrics", _shown(Path(logger.log_dir) / "metrics.csv")))
            elif isinstance(logger, TensorBoardLogger):
                rows.append(("tensorboard", f"tensorboard --logdir {shlex.quote(_shown(logger.root_dir))}"))
        last = checkpoint_dir(trainer) / LAST
        if last.exists():
            step = held_rollout_step(trainer, last)
            rows.append(("checkpoint", _shown(last) + (f" (after rollout step {step})" if step is not None else "")))
        for directory in _trajectory_dirs(trainer):
            rows.append(("episodes", f"python -m http.server -d {shlex.quote(_shown(directory))}  (open the page)"))
        if last.exists() and argv:
            rows.append(("resume", rerun_command("fit", argv)))
            rows.append(("validate", rerun_command("validate", argv)))
        width = max((len(name) for name, _ in rows), default=0)
        return [head] + [f"  {name.ljust(width)}  {value}" for name, value in rows]


def _trajectory_dirs(trainer: L.Trainer) -> list[Path]:
    from roll_lightning.callbacks.trajectories import TrajectoryDump

    return [
        c.directory
        for c in trainer.callbacks
        if isinstance(c, TrajectoryDump) and c.directory is not None and os.path.isdir(c.directory)
    ]
