"""Hypothesis properties of the advantages and losses: invariances, masks, finite gradients, ratio-1 identities."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll_lightning.algorithms import AGG_MODES, gae_advantages, gigpo_advantages, grpo_advantages, segment_ids
from roll_lightning.algorithms.aggregation import aggregate
from roll_lightning.algorithms.losses import gspo_policy_loss, kl_penalty, ppo_policy_loss, value_loss

SETTINGS = settings(max_examples=60, deadline=None)
shapes = st.tuples(st.integers(1, 5), st.integers(1, 7))
seeds = st.integers(0, 2**31 - 1)


def _group_batch(sizes: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer scores in [-5, 5] (clearly separated or exactly equal: away from the std <= eps threshold)."""
    gen = torch.Generator().manual_seed(seed)
    groups = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    groups = groups[torch.randperm(len(groups), generator=gen)]  # groups interleaved, as in a real batch
    scores = torch.randint(-5, 6, (len(groups),), generator=gen).float()
    return scores, groups


def _token_batch(shape: tuple[int, int], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b, length = shape

    def randn() -> torch.Tensor:
        return torch.randn(b, length, generator=gen, dtype=torch.float64)

    return dict(
        logp=-randn().abs() - 0.01,
        old_logp=-randn().abs() - 0.01,
        adv=randn(),
        row_adv=torch.randn(b, generator=gen, dtype=torch.float64),  # [B]: one advantage per row
        mask=torch.rand(b, length, generator=gen) < 0.6,
        garbage=randn() * 1e3,
    )


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), seeds, st.floats(-100, 100), st.booleans())
def test_grpo_shift_invariance(sizes: list[int], seed: int, shift: float, norm_by_std: bool) -> None:
    scores, groups = _group_batch(sizes, seed)
    shifted = scores.double() + torch.where(groups == 0, shift, 0.0)  # only group 0 moves (shifted in float64:
    a = grpo_advantages(scores.double(), groups, norm_by_std=norm_by_std)  # a float32 shift rounds the scores)
    b = grpo_advantages(shifted, groups, norm_by_std=norm_by_std)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), seeds, st.floats(0.5, 50.0))
def test_grpo_scale_invariance_with_std(sizes: list[int], seed: int, scale: float) -> None:
    scores, groups = _group_batch(sizes, seed)
    a, b = grpo_advantages(scores, groups), grpo_advantages(scores * scale, groups)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # eps makes it approximate: eps/std << 1e-4
    # and each group's advantages sum to 0
    sums = torch.zeros(len(sizes)).index_add(0, groups, a)
    torch.testing.assert_close(sums, torch.zeros(len(sizes)), atol=1e-4, rtol=0)


@SETTINGS
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), seeds, st.integers(1, 4), st.booleans())
def test_grpo_traj_dedup_ignores_extra_step_rows(sizes: list[int], seed: int, extra: int, norm_by_std: bool) -> None:
    scores, groups = _group_batch(sizes, seed)
    trajs = torch.arange(len(scores))  # one row per trajectory ...
    base = grpo_advantages(scores, groups, traj_ids=trajs, norm_by_std=norm_by_std)
    # ... then trajectory 0 gets `extra` more step rows (same episode score): nothing changes
    more = grpo_advantages(
        torch.cat([scores, scores[:1].repeat(extra)]),
        torch.cat([groups, groups[:1].repeat(extra)]),
        traj_ids=torch.cat([trajs, trajs[:1].repeat(extra)]),
        norm_by_std=norm_by_std,
    )
    torch.testing.assert_close(more[: len(scores)], base)
    torch.testing.assert_close(more[len(scores) :], base[:1].repeat(extra))


@SETTINGS
@given(st.lists(st.integers(1, 4), min_size=1, max_size=6), seeds)
def test_gigpo_step_term_sums_to_zero_per_anchor_group(traj_lens: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    traj = torch.repeat_interleave(torch.arange(len(traj_lens)), torch.tensor(traj_lens))
    step = torch.cat([torch.arange(n) for n in traj_lens])
    group, anchors = torch.zeros_like(traj), torch.randint(0, 3, traj.shape, generator=gen)
    episode = torch.randint(0, 3, (len(traj_lens),), generator=gen).double()[traj]
    rewards = torch.randint(-1, 2, traj.shape, generator=gen).double()
    full = gigpo_advantages(episode, rewards, group, traj, step, anchors, norm_by_std=False)
    episode_only = gigpo_advantages(episode, rewards, group, traj, step, anchors, norm_by_std=False, step_weight=0)
    a_step = full - episode_only
    sums = torch.zeros(3, dtype=torch.float64).index_add(0, anchors, a_step)
    torch.testing.assert_close(sums, torch.zeros(3, dtype=torch.float64), atol=1e-9, rtol=0)


def _losses(batch: dict[str, torch.Tensor], mode: str) -> list[tuple[torch.Tensor, dict]]:
    logp, old, adv, mask = batch["logp"], batch["old_logp"], batch["adv"], batch["mask"]
    return [
        ppo_policy_loss(logp, old, adv, mask, agg=mode, dual_clip=3.0),  # type: ignore[arg-type]
        ppo_policy_loss(logp, old, batch["row_adv"], mask, agg=mode, clip_high=0.28),  # type: ignore[arg-type]
        gspo_policy_loss(logp, old, adv, mask),
        gspo_policy_loss(logp, old, batch["row_adv"], mask, seq_ids=segment_ids(mask)),
        value_loss(logp, old, adv, mask, agg=mode),  # type: ignore[arg-type]
        (aggregate(kl_penalty(logp, old, "low_var_kl"), mask, mode), {}),  # type: ignore[arg-type]
    ]


@SETTINGS
@given(shapes, seeds, st.sampled_from(AGG_MODES))
def test_masked_positions_change_nothing(shape: tuple[int, int], seed: int, mode: str) -> None:
    batch = _token_batch(shape, seed)
    mask, garbage = batch["mask"], batch["garbage"]
    dirty = {k: torch.where(mask, v, garbage) if k in ("logp", "old_logp", "adv") else v for k, v in batch.items()}
    dirty["logp"] = torch.where(mask, dirty["logp"], float("nan"))  # not even NaN leaks
    for (clean_loss, clean_m), (dirty_loss, dirty_m) in zip(_losses(batch, mode), _losses(dirty, mode), strict=True):
        torch.testing.assert_close(clean_loss, dirty_loss)
        for key in clean_m:
            torch.testing.assert_close(clean_m[key], dirty_m[key], msg=key)
    rewards, values = torch.where(mask, batch["adv"], 0), batch["old_logp"]
    clean = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.7)
    dirty_gae = gae_advantages(torch.where(mask, rewards, garbage), dirty["old_logp"], mask, gamma=0.9, lam=0.7)
    for a, b in zip(clean, dirty_gae, strict=True):
        torch.testing.assert_close(a, b)
        assert (a[~mask] == 0).all()


@SETTINGS
@given(shapes, seeds, st.sampled_from(AGG_MODES))
def test_gradients_finite_and_zero_off_mask(shape: tuple[int, int], seed: int, mode: str) -> None:
    batch = _token_batch(shape, seed)
    batch["logp"] = (batch["logp"] * 10).requires_grad_()  # large ratios too: exercises the clamps
    for loss, metrics in _losses(batch, mode):
        (grad,) = torch.autograd.grad(loss, batch["logp"])
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert (grad[~batch["mask"]] == 0).all()
        assert all(torch.isfinite(v) and not v.requires_grad for v in metrics.values())


@SETTINGS
@given(shapes, seeds, st.sampled_from([None, 1.5, 3.0]))
def test_ppo_at_ratio_one_is_minus_mean_advantage(shape: tuple[int, int], seed: int, dual: float | None) -> None:
    batch = _token_batch(shape, seed)
    mask, adv = batch["mask"], batch["adv"]
    loss, m = ppo_policy_loss(batch["logp"], batch["logp"], adv, mask, dual_clip=dual)
    expected = -adv[mask].mean() if mask.any() else torch.zeros((), dtype=adv.dtype)
    torch.testing.assert_close(loss, expected)
    assert m["pg_clipfrac"] == 0 and m["pg_clipfrac_lower"] == 0 and m["ppo_kl"] == 0


@SETTINGS
@given(shapes, seeds)
def test_gspo_identical_policies_have_ratio_one(shape: tuple[int, int], seed: int) -> None:
    batch = _token_batch(shape, seed)
    mask, adv = batch["mask"], batch["row_adv"]
    loss, m = gspo_policy_loss(batch["logp"], batch["logp"], adv, mask)
    rows = mask.any(-1)
    if rows.any():
        assert m["ratio_max"] == 1 and m["ratio_min"] == 1 and m["ratio_mean"] == 1
        torch.testing.assert_close(loss, -adv[rows].mean())  # one advantage per row, s = 1: -mean_i A_i
    assert m["pg_clipfrac"] == 0
