"""Row layouts, chosen once from ``data.rollout.episode.layout``: what prompt each turn sees and how a finished
episode becomes training rows.

- `TRAJECTORY` (``trajectory``): one growing conversation per episode; the engine sees the whole history (its
  token ids are kept, never re-rendered), and the episode is one row ``[prompt_1, reply_1, obs_2, reply_2, ...]``.
- `STEP` (``step``): every turn re-renders a fresh prompt (the system message, a window of
  ``prompt.history_turns`` past turns, the observation), and each turn is its own row with its ``step`` index
  and ``anchor`` observation: what GiGPO groups steps by (``one_row_per_turn``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from roll_lightning.rollout.prompts.vision import PromptImage

if TYPE_CHECKING:
    from roll_lightning.rollout.episodes.episode import Episode, EpisodeBuilder


@dataclass(frozen=True)
class Row:
    """One training row before padding: token ids, which are replies, the engine's log-probs (0 off the replies),
    ``(position, reward)`` of each turn on its last token, and the row's scalars (see `batch.RolloutBatch`)."""

    ids: list[int]
    response: list[bool]
    logprobs: list[float]
    rewards: list[tuple[int, float]]
    step_score: float
    step: int
    version: int
    anchor: str
    episode: Episode
    images: tuple[PromptImage, ...] = ()  # the pictures of ``ids``, in order


class Layout(ABC):
    """A row layout: the prompt of each turn, the text of a reply, the rows of an episode."""

    name: ClassVar[str]
    one_row_per_turn: ClassVar[bool]

    @abstractmethod
    def next_prompt(self, builder: EpisodeBuilder, turn: int) -> tuple[list[int], list[int]]:
        """``(this turn's prompt ids as the turn records them, the whole prompt the engine gets)``."""

    @abstractmethod
    def reply_text(self, builder: EpisodeBuilder, token_ids: list[int]) -> str:
        """The reply as the conversation keeps it: the reply prefix, then the reply (its stop token left out)."""

    @abstractmethod
    def rows(self, episode: Episode) -> list[Row]:
        """The episode's training rows (none for an episode without turns)."""

    @abstractmethod
    def turns_of_row(self, step: int) -> range:
        """The turns a row covers, from its ``step`` value (the batch's ``step`` tensor)."""

    def __repr__(self) -> str:
        return f"Layout({self.name!r})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return layout_named, (self.name,)  # unpickled (a batch sent to another rank), it is the same object


class Trajectory(Layout):
    name: ClassVar[str] = "trajectory"
    one_row_per_turn: ClassVar[bool] = False

    def next_prompt(self, builder: EpisodeBuilder, turn: int) -> tuple[list[int], list[int]]:
        return builder.grown_prompt(turn)

    def reply_text(self, builder: EpisodeBuilder, token_ids: list[int]) -> str:
        return builder.kept_reply(token_ids)

    def rows(self, episode: Episode) -> list[Row]:
        if not episode.turns:
            return []
        ids: list[int] = []
        response: list[bool] = []
        logprobs: list[float] = []
        rewards: list[tuple[int, float]] = []
        for turn in episode.turns:
            ids += turn.prompt_ids + turn.response_ids
            response += [False] * len(turn.prompt_ids) + [True] * len(turn.response_ids)
            logprobs += [0.0] * len(turn.prompt_ids) + turn.logprobs
            rewards.append((len(ids) - 1, turn.reward))
        return [
            Row(
                ids, response, logprobs, rewards, step_score=episode.score, step=len(episode.turns),
                version=episode.policy_version, anchor=episode.turns[0].state, episode=episode,
                images=tuple(image for turn in episode.turns for image in turn.images),
            )
        ]  # fmt: skip

    def turns_of_row(self, step: int) -> range:
        return range(step)  # a trajectory row's step is its number of turns


class Step(Layout):
    name: ClassVar[str] = "step"
    one_row_per_turn: ClassVar[bool] = True

    def next_prompt(self, builder: EpisodeBuilder, turn: int) -> tuple[list[int], list[int]]:
        prompt = builder.window_prompt(turn)
        return prompt, prompt

    def reply_text(self, builder: EpisodeBuilder, token_ids: list[int]) -> str:
        return builder.fresh_reply(token_ids)

    def rows(self, episode: Episode) -> list[Row]:
        rows = []
        for k, turn in enumerate(episode.turns):
            ids = turn.prompt_ids + turn.response_ids
            rows.append(
                Row(
                    ids, [False] * len(turn.prompt_ids) + [True] * len(turn.response_ids),
                    [0.0] * len(turn.prompt_ids) + turn.logprobs, [(len(ids) - 1, turn.reward)],
                    step_score=turn.reward, step=episode.first_turn + k, version=turn.policy_version, anchor=turn.state,
                    episode=episode, images=turn.images,
                )
            )  # fmt: skip
        return rows

    def turns_of_row(self, step: int) -> range:
        return range(step, step + 1)  # the turn's index in the whole episode (a fork's start after its first_turn)


TRAJECTORY, STEP = Trajectory(), Step()
LAYOUTS: dict[str, Layout] = {TRAJECTORY.name: TRAJECTORY, STEP.name: STEP}


def layout_named(name: str | Layout) -> Layout:
    """The layout called ``name`` (a `Layout` passes through); an unknown name says which exist."""
    if isinstance(name, Layout):
        return name
    if name not in LAYOUTS:
        raise ValueError(f"unknown row layout {name!r}: choose one of {', '.join(LAYOUTS)}")
    return LAYOUTS[name]
