"""Advantage estimators: GRPO (group baseline), GiGPO (episode + anchor-state groups), GAE (critic).

All functions are constants for the loss (computed under ``no_grad``). Ids are integer tensors ``[B]``; only
equality matters (build them from the batch's string lists with `ids_to_index` / `anchor_ids`). The ``[B]``
results are broadcast to a row's response tokens by the loss (``A_tok = A_i * m``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from roll_lightning.algorithms.aggregation import masked_mean
from roll_lightning.algorithms.grouping import dense_index, group_normalize


def _first_row_per_traj(group_ids: Tensor, traj_ids: Tensor) -> Tensor:
    """Bool ``[B]``: True on the first row of each (group, trajectory)."""
    key, n = dense_index(group_ids, traj_ids)
    rows = torch.arange(key.numel(), device=key.device)
    first = torch.full((n,), key.numel(), dtype=torch.long, device=key.device).scatter_reduce(0, key, rows, "amin")
    out = torch.zeros(key.numel(), dtype=torch.bool, device=key.device)
    out[first] = True
    return out


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    traj_ids: Tensor | None = None,
) -> Tensor:
    """GRPO outcome advantage per row, ``[B]``:

        A_i = (S_i - mean_g S) / (std_g S + eps)      (norm_by_std, GRPO)
        A_i =  S_i - mean_g S                         (Dr.GRPO)

    scores: ``[B]`` (e.g. ``batch.episode_scores``); group_ids: ``[B]`` int (same initial state = same group).
    Conventions:
    - Statistics are over *trajectories*: with ``traj_ids`` (step rows, several rows per episode) each
      (group, trajectory) contributes one value, its first row's score. verl-agent's default
      (``compute_mean_std_cross_steps=True``) instead counts a T-step trajectory T times; omit ``traj_ids``
      to get that (or for trajectory rows, where a row is a trajectory).
    - ``std`` is the unbiased (N-1) sample std (``torch.std``); ``eps`` is added to the std, not the variance.
    - Singleton groups (one trajectory) and, with std, groups with ``std <= eps`` give 0 (ROLL's rule;
      verl-agent gives a singleton ``S_i / (1 + eps)``, i.e. no baseline at all).
    """
    group, n = dense_index(group_ids)
    stats_rows = None if traj_ids is None else _first_row_per_traj(group_ids, traj_ids)
    return group_normalize(scores, group, n, norm_by_std=norm_by_std, eps=eps, stats_rows=stats_rows)


@torch.no_grad()
def discounted_step_returns(step_rewards: Tensor, traj_ids: Tensor, step_index: Tensor, gamma: float) -> Tensor:
    """``R_t = sum_{k>=t} gamma^(k-t) r_k`` within each trajectory (GiGPO Eq. 5), rows in any order, ``[B]``.

    ``step_index`` only orders a trajectory's rows; the exponent counts rows, so a trajectory is its rows (as in
    verl-agent, where only active steps exist). A repeated (traj, step) pair is an error, not a silent
    double count.
    """
    traj = traj_ids.tolist()
    step = step_index.tolist()
    rewards = step_rewards.detach().to(torch.float64).tolist()
    order = sorted(range(len(traj)), key=lambda i: (traj[i], step[i]))
    out = [0.0] * len(traj)
    following: int | None = None  # the row after this one in time, same trajectory
    for i in reversed(order):
        if following is not None and traj[following] == traj[i]:
            if step[following] == step[i]:
                raise ValueError(f"trajectory {traj[i]} has two rows with step {step[i]}")
            out[i] = rewards[i] + gamma * out[following]
        else:
            out[i] = rewards[i]
        following = i
    return torch.tensor(out, dtype=torch.float64, device=step_rewards.device).to(step_rewards.dtype)


@torch.no_grad()
def gigpo_advantages(
    episode_scores: Tensor,
    step_rewards: Tensor,
    group_ids: Tensor,
    traj_ids: Tensor,
    step_index: Tensor,
    anchors: Tensor,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    episode_cross_steps: bool = False,
) -> Tensor:
    """GiGPO (arXiv 2505.10978, Eqs. 3-8) for step rows (one row per turn), ``[B]``:

        A_E(i) = (R(tau_i) - mean_g R(tau)) / F          episode level, one value per trajectory of group g
        R_t    = sum_{k>=t} gamma^(k-t) r_k                discounted step return within the trajectory
        A_S(i) = (R_t(i) - mean_{g,s} R_t) / F          step level, rows of group g with anchor state s
        A      = A_E + step_weight * A_S

    ``F`` = ``std + eps`` (``norm_by_std``, verl-agent ``mean_std_norm`` / ROLL ``mean_std``) or 1 (``mean_norm``
    / ``mean``; the verl-agent default): the *same* mode at both levels. ``anchors`` are integer anchor-state
    ids (`anchor_ids`); every row with the same (group, anchor) is in one step group, including revisits of a
    state within one trajectory. Degenerate groups (singleton, or std mode with ``std <= eps``) give 0 at
    either level. Invalid-action penalties must already be in ``step_rewards``/``episode_scores``.

    Differences from the references (algorithms.md §3, §6):
    - episode stats: one value per trajectory (``episode_cross_steps=True``: one per row, verl-agent default);
    - episode singleton: 0 here and in ROLL, ``R(tau_i) / (1 + eps)`` in verl-agent;
    - step groups are scoped by (group, anchor) as in verl-agent; ROLL pools equal states across groups;
    - weights: verl-agent ``A_E + w A_S`` (used here); ROLL ``w_E A_E + w_S A_S`` (scale ``A`` for ``w_E``).
    """
    a_episode = grpo_advantages(
        episode_scores,
        group_ids,
        norm_by_std=norm_by_std,
        eps=eps,
        traj_ids=None if episode_cross_steps else traj_ids,
    )
    returns = discounted_step_returns(step_rewards, traj_ids, step_index, gamma)
    step_group, n = dense_index(group_ids, anchors)
    a_step = group_normalize(returns, step_group, n, norm_by_std=norm_by_std, eps=eps)
    return a_episode + step_weight * a_step.to(a_episode.dtype)


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor, values: Tensor, response_mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """GAE (Schulman et al. 2015) over the response tokens of each row, ``[B, L]`` in, ``([B, L], [B, L])`` out:

        delta_t = r_t + gamma V_next(t) - V_t
        A_t     = delta_t + gamma lam A_next(t)
        returns = A + V

    ``next(t)`` is the next *response* position of the row: positions off ``response_mask`` (prompt,
    observation tokens between turns, padding) are skipped, not treated as time steps. So in a trajectory row
    the last token of turn k bootstraps from the value of the first reply token of turn k+1, and the
    environment's text is not discounted. After the last response token V_next = A_next = 0 (episode ended).
    Rewards off the mask are ignored (the batch puts each turn's reward on its last reply token); advantages
    and returns are 0 off the mask. For step rows each row is one turn, so GAE never crosses turns (verl-agent).
    verl then whitens the advantages (see `whiten`); that is left to the caller.
    """
    if not token_rewards.shape == values.shape == response_mask.shape:
        raise ValueError(f"shape mismatch: {token_rewards.shape}, {values.shape}, {response_mask.shape}")
    mask = response_mask.bool()
    dtype = torch.promote_types(values.dtype, torch.float32)  # bf16 values: accumulate in float32
    rewards = torch.where(mask, token_rewards, 0).to(dtype)
    v = torch.where(mask, values, 0).to(dtype)
    advantages = torch.zeros_like(v)
    next_value = torch.zeros_like(v[:, 0])
    next_adv = torch.zeros_like(v[:, 0])
    for t in reversed(range(v.shape[1])):
        here = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - v[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(here, adv, 0)
        # Off the mask the carried (value, advantage) pass through unchanged: this is what skips the gap.
        next_value = torch.where(here, v[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = torch.where(mask, advantages + v, 0)
    return advantages.to(values.dtype), returns.to(values.dtype)


@torch.no_grad()
def whiten(x: Tensor, mask: Tensor, *, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries (unbiased var, as verl's ``masked_whiten``).

    ``shift_mean=False`` adds the mean back (scales only). Entries off the mask are 0.
    """
    m = mask.bool()
    mean = masked_mean(x, m)
    n = m.sum()
    var = torch.where(m, (x - mean) ** 2, 0).sum() / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, 0)
