"""`EvalReport`: one held-out evaluation during fit, as the terminal shows it."""

from __future__ import annotations

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
    env's success in a multi-env evaluation (``eval/<tag>/success_rate``)."""

    step: int
    success: float
    minutes: float
    first: float | None = None
    tags: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, step: int, metrics: dict[str, float], minutes: float, first: EvalReport | None) -> EvalReport:
        """The report of an evaluation's ``eval/*`` metrics."""
        tags = {
            key.split("/")[1]: value
            for key, value in metrics.items()
            if key.startswith("eval/") and key.endswith("/success_rate") and key.count("/") == 2
        }
        return cls(step, metrics["eval/success_rate"], minutes, None if first is None else first.success, tags)

    def line(self) -> str:
        text = f"held-out success {100 * self.success:.1f}%"
        if self.tags:
            text += " (" + ", ".join(f"{tag} {100 * value:.1f}%" for tag, value in self.tags.items()) + ")"
        text += f" after {self.step} rollout steps ({self.minutes:.1f} min)"
        if self.first is not None:
            text += f": {100 * (self.success - self.first):+.1f} points since the first evaluation"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
