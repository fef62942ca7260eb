"""The vine estimator (docs/algorithms.md §9) against a hand-computed tree: a spine forked before turn 1 into one
copy, a second member that played from the reset, gamma 0.5."""

from __future__ import annotations

import pytest
import torch

from roll_lightning.algorithms import ESTIMATORS, AdvantageInputs, vine_advantages
from roll_lightning.training.config import AlgorithmConfig


def test_a_forked_tree_by_hand() -> None:
    # rows: spine A turns 0, 1, 2 (rewards 0, 0, 4); copy B turns 1, 2 (0, 2); member C turns 0, 1 (0, 1).
    # states: every first step shares the reset (s0); A@1 and B@1 share the fork (f); the rest are alone.
    scores = torch.tensor([4.0, 4.0, 4.0, 2.0, 2.0, 1.0, 1.0])  # each trajectory's return (B: A's 0 before the fork)
    rewards = torch.tensor([0.0, 0.0, 4.0, 0.0, 2.0, 0.0, 1.0])
    groups = torch.zeros(7, dtype=torch.long)
    traj = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    step = torch.tensor([0, 1, 2, 1, 2, 0, 1])
    anchors = torch.tensor([0, 1, 2, 1, 3, 0, 4])
    got = vine_advantages(scores, rewards, groups, traj, step, anchors, gamma=0.5)
    # returns from each state: A 1, 2, 4; B 1, 2; C 0.5, 1
    # s0: A 1 vs C 0.5 -> +0.5, -0.5.  f: A 2 vs B 1 -> +1, -1.
    # alone (A@2, B@2, C@1): episode RLOO: A 4 - mean(2, 1) = 2.5; B 2 - mean(4, 1) = -0.5; C 1 - mean(4, 2) = -2
    want = torch.tensor([0.5, 1.0, 2.5, -1.0, -0.5, -0.5, -2.0])
    torch.testing.assert_close(got, want)


def test_a_group_of_one_and_a_registered_estimator() -> None:
    one = vine_advantages(torch.tensor([3.0]), torch.tensor([3.0]), torch.tensor([0]), torch.tensor([0]),
                          torch.tensor([0]), torch.tensor([0]))  # fmt: skip
    assert one.tolist() == [0.0]  # nothing to compare with: no signal, not a made-up one
    vine = ESTIMATORS["vine"](gamma=1.0)
    rows = AdvantageInputs(
        episode_scores=torch.tensor([1.0, 0.0]), step_scores=torch.tensor([1.0, 0.0]), token_scores=torch.zeros(2, 3),
        response_mask=torch.ones(2, 3), group_ids=torch.tensor([0, 0]), traj_ids=torch.tensor([0, 1]),
        step_index=torch.tensor([0, 0]), anchors=torch.tensor([5, 5]),
    )  # fmt: skip
    advantages, values = vine(rows)
    assert advantages.tolist() == [1.0, -1.0] and values is None
    with pytest.raises(ValueError, match="vine needs the rows' state ids"):
        vine(AdvantageInputs(**{**rows.__dict__, "anchors": None}))


def test_batch_std_scale_keeps_the_size_of_each_difference() -> None:
    # two forks of two siblings: returns differ by 2 at one and by 0.2 at the other. One divisor for the batch keeps
    # the 10:1 ratio (a per-state std would make both +-1); the scaled advantages have std 1 whatever the reward's
    # scale, so multiplying the rewards by 10 changes nothing.
    rewards = torch.tensor([2.0, 0.0, 0.2, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    traj, step, anchors = torch.tensor([0, 1, 2, 3]), torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1])
    raw = vine_advantages(rewards, rewards, groups, traj, step, anchors)
    torch.testing.assert_close(raw, torch.tensor([2.0, -2.0, 0.2, -0.2]))
    scaled = vine_advantages(rewards, rewards, groups, traj, step, anchors, scale="batch_std")
    std = torch.tensor([2.0, -2.0, 0.2, -0.2]).std(unbiased=False)
    torch.testing.assert_close(scaled, raw / (std + 1e-6))
    tenfold = vine_advantages(10 * rewards, 10 * rewards, groups, traj, step, anchors, scale="batch_std")
    torch.testing.assert_close(tenfold, scaled, rtol=1e-5, atol=1e-6)
    settings = AlgorithmConfig(estimator="vine", vine_scale="batch_std")
    assert ESTIMATORS["vine"].from_settings(settings).scale == "batch_std"
