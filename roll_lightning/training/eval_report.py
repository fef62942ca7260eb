"""`EvalReport`: one held-out evaluation during fit, as the terminal shows it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EvalReport:
    """Held-out success after ``step`` rollout steps, ``minutes`` into the fit; ``first`` is the run's first
    evaluation's success (None for that first one), so the line can say what training changed."""

    step: int
    success: float
    minutes: float
    first: float | None = None

    def line(self) -> str:
        text = f"held-out success {100 * self.success:.1f}% after {self.step} rollout steps ({self.minutes:.1f} min)"
        if self.first is not None:
            text += f": {100 * (self.success - self.first):+.1f} points since the first evaluation"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
