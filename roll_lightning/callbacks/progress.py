"""`RunProgress`: the run's progress in one line, whether stdout is a terminal or a file.

A terminal redraws the line every rollout step; a file gets a line at most every ``every_s`` seconds::

    step 600/5000 (12%) 7:06, ETA 22:54 | success 0.31 return 2.10 | held-out 28.9% (step 500)
        | 0.62 s/step: rollout 0.38 train 0.23 sync 0.001

It replaces Lightning's bar, whose epoch and batch counters mean nothing in an endless rollout stream.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import IO, Any

import lightning as L
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

from roll_lightning.training.module import AgentRLModule, max_time_timer


class RunProgress(ProgressBar):
    def __init__(self, every_s: float = 30.0, stream: IO[str] | None = None) -> None:
        """Args:
        every_s: seconds between lines when the output is not a terminal.
        stream: where to write (default: stdout).
        """
        super().__init__()
        self.every_s = every_s
        self._stream = stream
        self._enabled = True
        self._last_print = -float("inf")
        self._printed_evals = 0
        self._last_step_shown = -1
        self._line_open = False  # a terminal line to end before anything else is printed

    # -- ProgressBar's contract -----------------------------------------------------------------------

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def stream(self) -> IO[str]:
        return self._stream or sys.stdout

    @property
    def is_terminal(self) -> bool:
        return bool(getattr(self.stream, "isatty", lambda: False)())

    # -- hooks ----------------------------------------------------------------------------------------

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = _agent(pl_module)
        self._printed_evals = len(module.fit_record.evals)  # not a resumed run's earlier ones
        module.fit_record.evals_shown = True  # this display prints them (`print_evals`), the module need not
        self._write(self.start_line(trainer, module), final=True)

    def start_line(self, trainer: L.Trainer, module: AgentRLModule) -> str:
        from roll_lightning.rollout.datamodule import RolloutDataModule

        weights = sum(p.numel() for p in module.actor.parameters())
        text = f"fit: {Path(module.model_path).name} ({_count(weights)} weights)"
        data = trainer.datamodule
        if isinstance(data, RolloutDataModule):
            lanes = data.rollout.lanes
            envs = lanes[0].env_id if len(lanes) == 1 else " + ".join(f"{x.tag} ({x.groups} groups)" for x in lanes)
            per_rank, ranks = data.rollout.batch_size, trainer.world_size
            text += f" on {envs}, {per_rank} episodes per rollout step"
            if ranks > 1:  # each rank plays its own groups
                text += f" on each of {ranks} ranks ({per_rank * ranks} in all)"
        if module.rollout_steps_limit:
            text += f", {module.rollout_steps_limit} steps"
        left = _seconds_left(trainer)
        if left is not None:
            text += f" or {clock(left)}, whichever comes first"
        if module.steps_done:
            text += f", resuming after step {module.steps_done}"
            elastic = getattr(data, "elastic", None)
            if elastic is not None:
                text += f" {elastic.describe()}"
        return text + f" -> {trainer.default_root_dir}"

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.print_evals(_agent(pl_module))  # the evaluation before the first update

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        module = _agent(pl_module)
        self.print_evals(module)
        now = time.monotonic()
        if self.is_terminal or now - self._last_print >= self.every_s or module.stopping:
            self._last_print = now
            self._write(self.line(trainer, module), final=not self.is_terminal)
            self._last_step_shown = module.steps_done

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":  # not the checkpoint's fit evaluations
            self._printed_evals = len(_agent(pl_module).fit_record.evals)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.print_evals(_agent(pl_module))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = _agent(pl_module)
        self.print_evals(module)
        if self._line_open or self._last_step_shown != module.steps_done:  # the last step, whatever ended it
            self._write(self.line(trainer, module), final=True)
            self._last_step_shown = module.steps_done

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._line_open:
            self.stream.write("\n")
            self._line_open = False

    # -- what is printed ------------------------------------------------------------------------------

    def print_evals(self, module: AgentRLModule) -> None:
        """Each held-out evaluation not printed yet, on a line of its own."""
        for report in module.fit_record.evals[self._printed_evals :]:
            self._write(report.line(), final=True)
        self._printed_evals = len(module.fit_record.evals)

    def line(self, trainer: L.Trainer, module: AgentRLModule) -> str:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        done, total = module.steps_done, module.rollout_steps_limit
        elapsed = time.perf_counter() - module.fit_record.started
        parts = [f"step {done}/{total} ({100 * done / total:.0f}%)" if total else f"step {done}"]
        parts[0] += f" {clock(elapsed)}"
        left = total - done if total else None
        eta = _eta(elapsed, done - module.fit_record.steps_at_start, left, _seconds_left(trainer))
        if eta is not None:
            parts[0] += f", ETA {clock(eta)}"
        if "rollout/success_rate" in metrics:
            parts.append(f"success {metrics['rollout/success_rate']:.2f} return {metrics['rollout/return_mean']:.2f}")
            tags = {k.split("/")[1]: v for k, v in metrics.items() if _tag_success(k)}
            if tags:  # a multi-env run: each env's success
                parts[-1] += " (" + " ".join(f"{tag} {value:.2f}" for tag, value in tags.items()) + ")"
        if module.fit_record.evals:
            last = module.fit_record.evals[-1]
            parts.append(f"held-out {100 * last.success:.1f}% (step {last.step})")
        if "timing/step_s" in metrics:
            split = " ".join(
                f"{name} {metrics[key]:.2f}"
                for name, key in (("rollout", "timing/rollout_wait_s"), ("train", "timing/train_s"))
                if key in metrics
            )
            sync = f" sync {metrics['sync/total_s']:.3f}" if "sync/total_s" in metrics else ""
            parts.append(f"{metrics['timing/step_s']:.2f} s/step: {split}{sync}")
        return " | ".join(parts)

    def _write(self, text: str, final: bool) -> None:
        if not self._enabled or not _rank_zero():
            return
        if self.is_terminal:
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
            self._line_open = not final
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _tag_success(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and parts[0] == "rollout" and parts[2] == "success_rate"


def _agent(pl_module: L.LightningModule) -> AgentRLModule:
    if not isinstance(pl_module, AgentRLModule):
        raise TypeError(f"RunProgress reports an AgentRLModule's run, got {type(pl_module).__name__}")
    return pl_module


def clock(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def _rank_zero() -> bool:
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def _seconds_left(trainer: L.Trainer) -> float | None:
    """What ``trainer.max_time`` leaves, or None without one."""
    timer = max_time_timer(trainer)
    return None if timer is None else timer.time_remaining("train")


def _eta(elapsed: float, done_here: int, left: int | None, time_left: float | None) -> float | None:
    """Seconds until the run ends: ``left`` steps at this fit's pace (since any resume), capped by ``max_time``."""
    by_steps = elapsed / done_here * left if left is not None and done_here > 0 else None
    candidates = [t for t in (by_steps, time_left) if t is not None]
    return max(0.0, min(candidates)) if candidates else None


__all__ = ["RunProgress"]
