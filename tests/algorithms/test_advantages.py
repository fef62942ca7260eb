"""Golden cases for the advantage estimators: small tensors, expectations worked out by hand (never by the
function under test)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from roll_lightning.algorithms import (
    anchor_ids,
    discounted_step_returns,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    ids_to_index,
)
from roll_lightning.algorithms.grouping import next_rows

EPS = 1e-6
T = torch.tensor


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


def test_ids_to_index_is_first_seen_order() -> None:
    assert ids_to_index(["b", "a", "b", "c", "a"]).tolist() == [0, 1, 0, 2, 1]
    assert ids_to_index([]).tolist() == []


def test_anchor_ids_equal_iff_identical() -> None:
    grid = np.array([[1, 2], [3, 4]])
    ids = anchor_ids(["#_P", "#_P", "#P_", grid, grid.copy(), grid.reshape(4), torch.tensor([[1, 2], [3, 4]])])
    assert ids[0] == ids[1] and ids[0] != ids[2]
    assert ids[3] == ids[4]  # same bytes, dtype, shape
    assert ids[3] != ids[5]  # same bytes, other shape
    assert ids[3] == ids[6]  # a tensor equals the array with the same content
    assert anchor_ids([{"a": [1, 2]}, {"a": [1, 2]}, {"a": [2, 1]}]).tolist() == [0, 0, 1]


def test_grpo_std_and_no_std() -> None:
    # group 7: [1, 2, 3] mean 2, unbiased std 1; group 3: [0, 4] mean 2, std sqrt(8)
    scores, groups = T([1.0, 0.0, 2.0, 4.0, 3.0]), T([7, 3, 7, 3, 7])
    s8 = math.sqrt(8.0)
    close(grpo_advantages(scores, groups), [-1 / (1 + EPS), -2 / (s8 + EPS), 0.0, 2 / (s8 + EPS), 1 / (1 + EPS)])
    close(grpo_advantages(scores, groups, norm_by_std=False), [-1.0, -2.0, 0.0, 2.0, 1.0])
    # eps is added to the std, not the variance: visible with a large eps
    close(grpo_advantages(T([0.0, 2.0]), T([0, 0]), eps=1.0), [-1 / (math.sqrt(2) + 1), 1 / (math.sqrt(2) + 1)])


def test_grpo_singleton_and_zero_std_groups_give_zero() -> None:
    scores, groups = T([5.0, 0.3, 0.3, 0.3, 9.0, 1.0]), T([0, 1, 1, 1, 2, 2])
    # group 0 singleton -> 0 (verl would give 5/(1+eps)); group 1 zero std -> 0; group 2 normal: mean 5, std sqrt(32)
    s32 = math.sqrt(32.0)
    close(grpo_advantages(scores, groups), [0.0, 0.0, 0.0, 0.0, 4 / (s32 + EPS), -4 / (s32 + EPS)])
    close(grpo_advantages(scores, groups, norm_by_std=False), [0.0, 0.0, 0.0, 0.0, 4.0, -4.0])


def test_grpo_traj_dedup_counts_each_trajectory_once() -> None:
    # one group: traj A has 3 step rows (score 10), traj B has 1 row (score 0)
    scores, groups, trajs = T([10.0, 10.0, 0.0, 10.0]), T([0, 0, 0, 0]), T([1, 1, 2, 1])
    # per trajectory: values [10, 0], mean 5, std sqrt(50)
    a = 5 / (math.sqrt(50.0) + EPS)
    close(grpo_advantages(scores, groups, traj_ids=trajs), [a, a, -a, a])
    close(grpo_advantages(scores, groups, traj_ids=trajs, norm_by_std=False), [5.0, 5.0, -5.0, 5.0])
    # per row (verl cross-steps): [10, 10, 0, 10], mean 7.5, std sqrt((3 * 2.5^2 + 7.5^2) / 3) = 5
    close(grpo_advantages(scores, groups), [2.5 / (5 + EPS), 2.5 / (5 + EPS), -7.5 / (5 + EPS), 2.5 / (5 + EPS)])
    # a group with one trajectory spread over several rows is a singleton
    close(grpo_advantages(T([3.0, 3.0, 3.0]), T([0, 0, 0]), traj_ids=T([4, 4, 4])), [0.0, 0.0, 0.0])


def test_grpo_batch_baseline_gives_flat_groups_a_signal() -> None:
    # group 0 all solved (10, 10), group 1 all failed (-1, -1): no signal within a group.
    # Over the batch: mean 4.5, unbiased std sqrt(4 * 5.5^2 / 3) = 11 / sqrt(3).
    scores, groups = T([10.0, 10.0, -1.0, -1.0]), T([0, 0, 1, 1])
    close(grpo_advantages(scores, groups), [0.0, 0.0, 0.0, 0.0])
    a = 5.5 / (11 / math.sqrt(3) + EPS)
    close(grpo_advantages(scores, groups, baseline="batch"), [a, a, -a, -a])
    close(grpo_advantages(scores, groups, baseline="batch", norm_by_std=False), [5.5, 5.5, -5.5, -5.5])
    # step rows: each trajectory once. Trajs 0 (2 rows, 10) and 1 (1 row, -1): mean 4.5, std sqrt(2 * 5.5^2).
    b = 5.5 / (5.5 * math.sqrt(2) + EPS)
    out = grpo_advantages(T([10.0, 10.0, -1.0]), T([0, 0, 1]), traj_ids=T([0, 0, 1]), baseline="batch")
    close(out, [b, b, -b])
    with pytest.raises(ValueError, match="baseline='team'"):
        grpo_advantages(scores, groups, baseline="team")  # type: ignore[arg-type]


def test_gigpo_batch_episode_baseline_keeps_step_groups_within_their_group() -> None:
    # the worked example's group plus a second group (traj 2, one row at anchor id 0, score 4): A_E is centred on
    # the batch of trajectories [10, 0, 4] (mean 14/3), A_S still only within (group, anchor).
    extra_row = [4.0, 4.0, 1, 2, 0, 0]  # score, step reward, group, traj, step, anchor
    inputs = {k: torch.cat([v, T([x])]) for (k, v), x in zip(_worked_example().items(), extra_row, strict=True)}
    out = gigpo_advantages(**inputs, gamma=0.5, norm_by_std=False, episode_baseline="batch")
    m = 14 / 3
    close(out, [10 - m + 10 / 3, 10 - m, -m - 5 / 3, -m - 5 / 3, -m, 4 - m])


def test_discounted_step_returns_order_and_discount() -> None:
    # traj 0 steps 0, 1, 2 with rewards 1, 0, 2 (rows shuffled); traj 1 one step, reward -1; gamma 0.5
    # R_2 = 2, R_1 = 0 + 0.5 * 2 = 1, R_0 = 1 + 0.5 * 1 = 1.5
    rewards, trajs, steps = T([2.0, -1.0, 1.0, 0.0]), T([0, 1, 0, 0]), T([2, 0, 0, 1])
    close(discounted_step_returns(rewards, trajs, steps, 0.5), [2.0, -1.0, 1.5, 1.0])
    with pytest.raises(ValueError, match="two rows with step"):
        discounted_step_returns(T([1.0, 1.0]), T([0, 0]), T([3, 3]), 0.5)


def _worked_example() -> dict[str, torch.Tensor]:
    # algorithms.md §3.7: traj A visits s0, s1 with rewards 0, 10; traj B visits s0, s0, s3 with rewards 0, 0, 0
    return dict(
        episode_scores=T([10.0, 10.0, 0.0, 0.0, 0.0]),
        step_rewards=T([0.0, 10.0, 0.0, 0.0, 0.0]),
        group_ids=T([0, 0, 0, 0, 0]),
        traj_ids=T([0, 0, 1, 1, 1]),
        step_index=T([0, 1, 0, 1, 2]),
        anchors=T([0, 1, 0, 0, 3]),
    )


def test_gigpo_reference_worked_example_mean_norm() -> None:
    # returns A: 5, 10; B: 0, 0, 0. Step group s0 = {5, 0, 0} mean 5/3 -> A_S = [10/3, 0, -5/3, -5/3, 0]
    a_step = [10 / 3, 0.0, -5 / 3, -5 / 3, 0.0]
    # verl cross-steps episode stats: mean of [10, 10, 0, 0, 0] = 4 -> A_E = [6, 6, -4, -4, -4]
    out = gigpo_advantages(**_worked_example(), gamma=0.5, norm_by_std=False, episode_cross_steps=True)
    close(out, [6 + a_step[0], 6.0, -4 + a_step[2], -4 + a_step[3], -4.0])  # = [9.33, 6, -5.67, -5.67, -4]
    # default: one value per trajectory, mean of [10, 0] = 5 -> A_E = [5, 5, -5, -5, -5]
    out = gigpo_advantages(**_worked_example(), gamma=0.5, norm_by_std=False)
    close(out, [5 + 10 / 3, 5.0, -5 - 5 / 3, -5 - 5 / 3, -5.0])
    out = gigpo_advantages(**_worked_example(), gamma=0.5, norm_by_std=False, step_weight=0.5)
    close(out, [5 + 5 / 3, 5.0, -5 - 5 / 6, -5 - 5 / 6, -5.0])


def test_gigpo_std_two_anchors_two_groups() -> None:
    # group 0: trajs 0 (s0 -> s1, rewards 0, 1) and 1 (s0 -> s1, rewards 0, 0); episode scores 1 and 0.
    # group 1 uses the same anchor ids but must not be pooled with group 0: trajs 2 (s0, reward 2), 3 (s0, 2).
    gamma = 0.9
    inputs = dict(
        episode_scores=T([1.0, 1.0, 0.0, 0.0, 2.0, 2.0]),
        step_rewards=T([0.0, 1.0, 0.0, 0.0, 2.0, 2.0]),
        group_ids=T([0, 0, 0, 0, 1, 1]),
        traj_ids=T([0, 0, 1, 1, 2, 3]),
        step_index=T([0, 1, 0, 1, 0, 0]),
        anchors=T([0, 1, 0, 1, 0, 0]),
    )
    # episode, group 0: [1, 0] mean 0.5 std sqrt(0.5); group 1: [2, 2] zero std -> 0
    e = 0.5 / (math.sqrt(0.5) + EPS)
    # returns: traj 0: R0 = 0 + 0.9 * 1 = 0.9, R1 = 1; traj 1: 0, 0; trajs 2, 3: 2, 2
    # step group (0, s0) = {0.9, 0}: mean 0.45, std sqrt(2 * 0.45^2) = 0.45 * sqrt 2; (0, s1) = {1, 0}: std sqrt .5
    s0 = 0.45 / (0.45 * math.sqrt(2) + EPS)
    s1 = 0.5 / (math.sqrt(0.5) + EPS)
    out = gigpo_advantages(**inputs, gamma=gamma)
    close(out, [e + s0, e + s1, -e - s0, -e - s1, 0.0, 0.0])


def test_gigpo_singleton_anchor_gives_episode_term_only() -> None:
    # two trajectories never share a state: every step group is a singleton -> GiGPO == GRPO over trajectories
    inputs = dict(
        episode_scores=T([3.0, 3.0, 1.0]),
        step_rewards=T([1.0, 2.0, 1.0]),
        group_ids=T([0, 0, 0]),
        traj_ids=T([0, 0, 1]),
        step_index=T([0, 1, 0]),
        anchors=T([10, 11, 12]),
    )
    e = 1 / (math.sqrt(2.0) + EPS)  # [3, 1]: mean 2, std sqrt 2
    close(gigpo_advantages(**inputs), [e, e, -e])


def test_gigpo_same_turn_does_not_reward_a_late_revisit() -> None:
    # Two failing episodes of one group, equal scores (-0.4): traj 0 answers invalidly twice and stays on s0
    # (rewards -0.2, -0.2); traj 1 moves s0 -> s1 (rewards -0.1, -0.3). Nothing separates them but the clock.
    inputs = dict(
        episode_scores=T([-0.4, -0.4, -0.4, -0.4]),
        step_rewards=T([-0.2, -0.2, -0.1, -0.3]),
        group_ids=T([0, 0, 0, 0]),
        traj_ids=T([0, 0, 1, 1]),
        step_index=T([0, 1, 0, 1]),
        anchors=T([0, 0, 0, 1]),
    )
    # returns (gamma 1): traj 0: -0.4, -0.2; traj 1: -0.4, -0.3. By state alone s0 = {-0.4, -0.2, -0.4}, mean
    # -1/3: the invalid reply at turn 1 gets +0.133 because fewer steps were left to pay for.
    by_state = gigpo_advantages(**inputs, gamma=1.0, norm_by_std=False)
    close(by_state, [-0.4 + 1 / 3, -0.2 + 1 / 3, -0.4 + 1 / 3, 0.0])
    # By (state, turn): (s0, 0) = {-0.4, -0.4}, (s0, 1) and (s1, 1) singletons -> no signal, as the outcomes say.
    close(gigpo_advantages(**inputs, gamma=1.0, norm_by_std=False, same_turn=True), [0.0, 0.0, 0.0, 0.0])
    # With std normalisation a difference of 0.2 in returns becomes a full-size advantage: -0.58, +1.15, -0.58
    # (unbiased std 0.115), as large as a solved level's would be.
    normed = gigpo_advantages(**inputs, gamma=1.0)
    close(normed, [-1 / math.sqrt(3), 2 / math.sqrt(3), -1 / math.sqrt(3), 0.0], atol=1e-4)
    close(gigpo_advantages(**inputs, gamma=1.0, same_turn=True), [0.0, 0.0, 0.0, 0.0])


def test_gae_skips_the_observation_gap_between_turns() -> None:
    gamma, lam = 0.9, 0.8
    # row 0: [prompt, r1, r1, obs, obs, r2, r2, pad]; rewards on the last token of each reply
    mask = T([[0, 1, 1, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    rewards = T([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0]])
    values = T([[9.0, 0.5, 0.6, 9.0, 9.0, 0.7, 0.8, 9.0], [9.0, 9.0, 0.1, 0.2, 0.3, 9.0, 9.0, 9.0]])
    expected = [[0.0] * 8 for _ in range(2)]
    for b, positions in ((0, [1, 2, 5, 6]), (1, [2, 3, 4])):
        next_v = next_a = 0.0
        for t in reversed(positions):  # the 9.0s off the mask must never be read
            delta = rewards[b, t].item() + gamma * next_v - values[b, t].item()
            next_a = delta + gamma * lam * next_a
            next_v = values[b, t].item()
            expected[b][t] = next_a
    # by hand for row 0, t = 2 (end of turn 1): delta = 1 + 0.9 * 0.7 - 0.6 = 1.03, bootstrapping from t = 5
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    close(adv, expected)
    close(ret, (torch.tensor(expected) + values * mask).tolist())
    assert expected[0][6] == pytest.approx(2 - 0.8)  # last token: bootstrap 0
    assert expected[0][2] == pytest.approx(1.03 + 0.72 * expected[0][5])


def test_gae_on_step_rows_chains_an_episodes_turns_like_one_trajectory_row() -> None:
    """Step rows are one episode cut at its turns: each row's last reply token must bootstrap from the next turn's
    first (not from 0, which would make the critic learn only the immediate reward)."""
    gamma, lam = 0.9, 0.8
    # one trajectory row: [prompt, r1, r1, obs, r2, obs, r3]; rewards at each turn's last reply token
    traj_mask = T([[0, 1, 1, 0, 1, 0, 1]], dtype=torch.bool)
    traj_rewards = T([[0.0, 0.0, 0.5, 0.0, -0.1, 0.0, 2.0]])
    traj_values = T([[9.0, 0.3, 0.4, 9.0, 0.6, 9.0, 1.1]])
    want, want_ret = gae_advantages(traj_rewards, traj_values, traj_mask, gamma=gamma, lam=lam)
    # the same turns as three step rows [prompt, reply...], given out of order, beside another episode's row
    mask = T([[0, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    rewards = T([[0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.5, 0.0], [0.0, 0.0, -0.1, 0.0], [0.0, 1.0, 0.0, 0.0]])
    values = T([[9.0, 9.0, 1.1, 9.0], [9.0, 0.3, 0.4, 9.0], [9.0, 9.0, 0.6, 9.0], [9.0, 0.2, 9.0, 9.0]])
    links = next_rows(T([7, 7, 7, 8]), T([2, 0, 1, 0]))
    assert links.tolist() == [-1, 2, 0, -1]
    with pytest.raises(ValueError, match="two rows with step 1"):
        next_rows(T([7, 7]), T([1, 1]))
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, next_row=links)
    reply = traj_mask[0]
    got = torch.cat([adv[1, 1:3], adv[2, 2:3], adv[0, 2:3]])
    close(got, want[0, reply].tolist())
    close(torch.cat([ret[1, 1:3], ret[2, 2:3], ret[0, 2:3]]), want_ret[0, reply].tolist())
    close(adv[3], [0.0, 1.0 - 0.2, 0.0, 0.0])  # the other episode: alone, bootstrap 0
    # by hand, turn 2 (reward -0.1, value 0.6) bootstraps from turn 3 (value 1.1, advantage 2 - 1.1 = 0.9)
    assert adv[2, 2].item() == pytest.approx(-0.1 + 0.9 * 1.1 - 0.6 + 0.72 * 0.9)
    with pytest.raises(ValueError, match="cycle"):
        gae_advantages(rewards[:2], values[:2], mask[:2], gamma=gamma, lam=lam, next_row=T([1, 0]))
