"""``data.rollout.branch``: branching rollouts, where members of a group share a state by construction.

A group's ``spines`` members play from the reset as usual. Before each branch turn, a spine forks its env session
(``ForkSession``, env.proto) and its conversation into up to ``width - 1`` copies; each copy is another member of
the group and continues with its own replies. The spine's turns so far stay its own rows; a copy's rows start at
the fork, and its return counts the spine's rewards before it. The first step of the spine and of each copy after
a fork share one GiGPO state (exact, not an observation hash), and the ``vine`` estimator turns those siblings
into a Monte-Carlo value of the state. Members no fork took (the spines ended first) play from the reset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from roll_lightning.rollout.errors import RolloutConfigError
from roll_lightning.settings import check


@dataclass(frozen=True)
class BranchSettings:
    """Args:
    every: spines fork before turns ``every``, ``2 * every``, ... (0: not by this rule).
    at: turns a spine forks before, beside ``every`` (e.g. ``[1, 3]``).
    surprise: also fork after a reply whose mean surprise (minus the mean log-prob of its tokens, in nats) is at
        least this: where the policy was unsure, as ARPO branches after uncertain steps (0: not by this rule).
    width: the spine and its copies at each fork (>= 2): ``width - 1`` copies.
    spines: members per group that play from the reset and fork; the others are filled by copies.
    """

    every: int = 0
    at: tuple[int, ...] = ()
    surprise: float = 0.0
    width: int = 2
    spines: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", tuple(self.at))
        rules = {
            "every": (self.every >= 0, ">= 0"),
            "surprise": (self.surprise >= 0, ">= 0"),
            "at": (all(isinstance(t, int) and t >= 1 for t in self.at), "turns >= 1 (a fork at turn 0 is a group)"),
            "width": (self.width >= 2, ">= 2"),
            "spines": (self.spines >= 1, ">= 1"),
        }
        check("data.rollout.branch", self, rules, RolloutConfigError)

    @property
    def on(self) -> bool:
        return self.every > 0 or bool(self.at) or self.surprise > 0

    def forks_before(self, turn: int, last_logprobs: Sequence[float] = ()) -> bool:
        """Whether a spine forks before playing ``turn`` (0-based), its last reply's log-probs given."""
        if turn < 1:
            return False
        if (self.every > 0 and turn % self.every == 0) or turn in self.at:
            return True
        return self.surprise > 0 and bool(last_logprobs) and -sum(last_logprobs) / len(last_logprobs) >= self.surprise
