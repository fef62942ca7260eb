"""`EvalReport`: one held-out evaluation during fit, as the terminal shows it; `FitRecord`: what the terminal,
the summary and the trajectory dumps read of a fit."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class EvalPrinter(Protocol):
    """A progress display that prints each held-out evaluation itself (`callbacks.RunProgress`); without one,
    the module logs the evaluation's line."""

    def print_evals(self, module: Any) -> None: ...


@dataclass(frozen=True)
class EvalReport:
    """Held-out success after ``step`` rollout steps, ``minutes`` into the fit; ``first`` is the run's first
    evaluation's success (None for that first one), so the line can say what training changed. ``tags``: each
    env's success in a multi-env evaluation (``eval/<tag>/success_rate``); ``invalid``: the share of replies the
    env could not parse (``eval/invalid_action_rate``); ``episodes``: how many were played."""

    step: int
    success: float
    minutes: float
    first: float | None = None
    tags: dict[str, float] = field(default_factory=dict)
    invalid: float | None = None
    episodes: int | None = None

    @classmethod
    def of(
        cls, step: int, metrics: dict[str, float], minutes: float, first: EvalReport | None, episodes: int | None = None
    ) -> EvalReport:
        """The report of an evaluation's ``eval/*`` metrics."""
        tags = {
            key.split("/")[1]: value
            for key, value in metrics.items()
            if key.startswith("eval/") and key.endswith("/success_rate") and key.count("/") == 2
        }
        invalid = metrics.get("eval/invalid_action_rate")
        first_success = None if first is None else first.success
        return cls(step, metrics["eval/success_rate"], minutes, first_success, tags, invalid, episodes)

    def success_text(self) -> str:
        """``held-out success 40.6%`` (with each env's in a multi-env evaluation)."""
        text = f"held-out success {100 * self.success:.1f}%"
        if self.tags:
            text += " (" + ", ".join(f"{tag} {100 * value:.1f}%" for tag, value in self.tags.items()) + ")"
        return text

    def invalid_text(self) -> str:
        return "" if self.invalid is None else f"invalid replies {100 * self.invalid:.1f}%"

    def validate_line(self) -> str:
        """What one ``validate`` measured, and with which weights."""
        parts = [self.success_text() + (f" over {self.episodes} episodes" if self.episodes else "")]
        parts += [self.invalid_text()] if self.invalid is not None else []
        return f"validate: {', '.join(parts)}, with the weights after {self.step} rollout steps"

    def line(self) -> str:
        text = f"{self.success_text()} after {self.step} rollout steps ({self.minutes:.1f} min)"
        if self.first is not None:
            text += f": {100 * (self.success - self.first):+.1f} points since the first evaluation"
        if self.invalid is not None:
            text += f"; {self.invalid_text()}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FitRecord:
    """What the displays read of a fit, kept by the module in one place (``module.fit_record``)."""

    started: float = field(default_factory=time.perf_counter)  # this fit's start (minutes in reports, the ETA)
    steps_at_start: int = 0  # the step this fit started at (after a resume: the restored count)
    evals: list[EvalReport] = field(default_factory=list)  # held-out evaluations during fit, kept across resume
    last_batch: Any = None  # the batch just trained on (a `RolloutBatch`), for `TrajectoryDump`
    last_row_advantages: list[float] | None = None  # its rows' advantages, one per row

    def begin(self, steps_done: int) -> None:
        self.started, self.steps_at_start = time.perf_counter(), steps_done
