"""`EvalReport` (a held-out evaluation's line), `episode_lines` (one played episode, as `validate` shows it),
`held_out` (an evaluation as the run certificate records it) and `FitRecord`."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from roll_lightning.checkpoints.certificate import SHORT, HeldOut, Outcome
from roll_lightning.checkpoints.fingerprint import json_digest

if TYPE_CHECKING:
    from roll_lightning.rollout.episodes.batch import RolloutBatch
    from roll_lightning.rollout.episodes.episode import Episode

SHOWN_CHARS = 90  # of each observation and reply in `episode_lines`


@dataclass(frozen=True)
class EvalReport:
    """Held-out success after ``step`` rollout steps; ``first``: the first evaluation's; ``tags``: per env."""

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
        tags = {
            key.split("/")[1]: value
            for key, value in metrics.items()
            if key.startswith("eval/") and key.endswith("/success_rate") and key.count("/") == 2
        }
        invalid = metrics.get("eval/invalid_action_rate")
        first_success = None if first is None else first.success
        return cls(step, metrics["eval/success_rate"], minutes, first_success, tags, invalid, episodes)

    def success_text(self) -> str:
        text = f"held-out success {100 * self.success:.1f}%"
        if self.tags:
            text += " (" + ", ".join(f"{tag} {100 * value:.1f}%" for tag, value in self.tags.items()) + ")"
        return text

    def invalid_text(self) -> str:
        return "" if self.invalid is None else f"invalid replies {100 * self.invalid:.1f}%"

    def validate_line(self) -> str:
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


def episode_lines(episode: Episode, rows: int) -> list[str]:
    """One episode as training would record it: a header (tag, seed, member, turns, rows, return, how it ended,
    an agent's refused calls), then each turn: what it showed, the reply, its reward."""
    turns = len(episode.turns)
    refused = f", {episode.refused_calls} call(s) refused" if episode.refused_calls else ""
    lines = [
        f"episode {episode.tag or episode.env_id} seed {episode.seed} member {episode.member}: {turns} turn(s) in "
        f"{rows} row(s), return {episode.score:+.2f}, {episode.end_reason}{refused}"
    ]
    for k, turn in enumerate(episode.turns, 1):
        valid = "" if turn.action_valid or not episode.replies_judged else " (invalid)"
        lines.append(
            f"  {k}. saw {_short(turn.observation)} -> replied {_short(turn.reply)}{valid}, reward {turn.reward:+.2f}"
        )
    return lines


def held_out(batch: RolloutBatch, step: int, global_step: int, by: str) -> HeldOut:
    """An evaluation batch as the run certificate records it (this rank's episodes; `gathered` joins the ranks)."""
    outcomes = []
    for episode in batch.episodes:
        first = episode.turns[0].prompt_ids if episode.turns else []
        tokens = [[list(turn.prompt_ids), list(turn.response_ids)] for turn in episode.turns]
        success = episode.metrics()["success"] > 0
        tag = episode.tag or episode.env_id
        prompt, played = json_digest(first)[:SHORT], json_digest(tokens)[:SHORT]
        outcomes.append(Outcome(tag, episode.seed, success, episode.score, prompt, played))
    return HeldOut(step, global_step, tuple(outcomes), by=by)


def gathered(result: HeldOut) -> HeldOut:
    """Every rank's share of an evaluation, on every rank (a collective: all ranks call it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return result
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, result)
    return HeldOut.merged(parts)


def _short(text: str) -> str:
    flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return repr(flat if len(flat) <= SHOWN_CHARS else flat[: SHOWN_CHARS - 3] + "...")


@dataclass
class FitRecord:
    """What the displays read of a fit (``module.fit_record``)."""

    started: float = field(default_factory=time.perf_counter)
    steps_at_start: int = 0  # after a resume: the restored count
    evals: list[EvalReport] = field(default_factory=list)  # kept across resume
    last_batch: Any = None  # a `RolloutBatch`, for `TrajectoryDump`
    last_row_advantages: list[float] | None = None
    evals_shown: bool = False  # a display (`RunProgress`) prints the evaluations; else the module logs them
    held_out: list[HeldOut] = field(default_factory=list)  # this process's evaluations, for the run certificate

    def begin(self, steps_done: int) -> None:
        self.started, self.steps_at_start = time.perf_counter(), steps_done
