"""Golden cases for aggregation, PPO/GSPO/value losses, KL estimators and entropy (expectations by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from roll_lightning.algorithms import segment_ids
from roll_lightning.algorithms.aggregation import aggregate
from roll_lightning.algorithms.losses import (
    entropy_from_logits,
    gspo_policy_loss,
    kl_penalty,
    ppo_policy_loss,
    value_loss,
)

T = torch.tensor


def close(actual: torch.Tensor, expected: float | list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, T(expected, dtype=actual.dtype), atol=atol, rtol=1e-5)


# rows: [1, 2, 3 | 100 pad], [4 | pads], [empty row]
LOSS = T([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0], [7.0, 7.0, 7.0, 7.0]])
MASK = T([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-sum", (6 + 4) / 2),  # the empty row is not a sequence
        ("seq-mean-token-mean", (2 + 4) / 2),
        ("seq-mean-token-sum-norm", 10 / 4),  # sum / L, L = padded width 4
    ],
)
def test_aggregate_modes(mode: str, expected: float) -> None:
    close(aggregate(LOSS, MASK, mode), expected)  # type: ignore[arg-type]
    close(aggregate(LOSS, torch.zeros_like(MASK), mode), 0.0)  # type: ignore[arg-type]


def test_aggregate_norm_len_and_unknown_mode() -> None:
    close(aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=20), 10 / 20)
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(LOSS, MASK, "mean")  # type: ignore[arg-type]


def test_ppo_clipping_both_sides() -> None:
    ratios = [1.5, 0.5, 0.5, 1.5, 9.9]
    adv = T([[2.0, 2.0, -1.0, -1.0, 5.0]])
    mask = T([[1, 1, 1, 1, 0]], dtype=torch.bool)
    logp = torch.log(T([ratios])).requires_grad_()
    loss, m = ppo_policy_loss(logp, torch.zeros(1, 5), adv, mask)
    # A=2, r=1.5: max(-3, -2.4) = -2.4 (clipped at 1.2)    A=2, r=0.5: max(-1, -1.6) = -1 (unclipped)
    # A=-1, r=0.5: max(0.5, 0.8) = 0.8 (clipped at 0.8)    A=-1, r=1.5: max(1.5, 1.2) = 1.5 (unclipped)
    close(loss, (-2.4 - 1.0 + 0.8 + 1.5) / 4)
    close(m["pg_clipfrac"], 0.5)
    close(m["pg_clipfrac_lower"], 0.0)
    close(m["ratio_mean"], (1.5 + 0.5 + 0.5 + 1.5) / 4)
    close(m["ratio_max"], 1.5)
    close(m["ratio_min"], 0.5)
    close(m["ppo_kl"], -(math.log(1.5) * 2 + math.log(0.5) * 2) / 4)
    loss.backward()
    # d/dlogp of -A r = -A r on unclipped tokens, 0 on clipped ones and off the mask; token-mean divides by 4
    close(logp.grad, [[0.0, -2 * 0.5 / 4, 0.0, 1.5 / 4, 0.0]])


def test_ppo_clip_higher_and_dual_clip() -> None:
    # A = -1: r = 5 -> max(5, 1.2) = 5, dual clip c = 3 caps at 3; r = 2 -> 2 (< 3, no cap)
    # A = +1, r = 5 -> -1.28 with clip_high 0.28 (dual clip never applies to A > 0)
    logp = torch.log(T([[5.0, 2.0, 5.0]]))
    adv = T([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, m = ppo_policy_loss(logp, torch.zeros(1, 3), adv, mask, clip_high=0.28, dual_clip=3.0)
    close(loss, (3.0 + 2.0 - 1.28) / 3)
    close(m["pg_clipfrac_lower"], 1 / 3)
    close(m["pg_clipfrac"], 1 / 3)  # only the A > 0 token took the clipped branch
    loss_no_dual, _ = ppo_policy_loss(logp, torch.zeros(1, 3), adv, mask, clip_high=0.28)
    close(loss_no_dual, (5.0 + 2.0 - 1.28) / 3)
    with pytest.raises(ValueError, match="dual_clip"):
        ppo_policy_loss(logp, torch.zeros(1, 3), adv, mask, dual_clip=1.0)


def test_ppo_row_advantages_broadcast_and_agg() -> None:
    # ratio 1 everywhere: l = -A; rows of 3 and 1 tokens with A = 1 and 3
    mask = T([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    zeros = torch.zeros(2, 3)
    loss, _ = ppo_policy_loss(zeros, zeros, T([1.0, 3.0]), mask, agg="token-mean")
    close(loss, -(1 + 1 + 1 + 3) / 4)
    loss, _ = ppo_policy_loss(zeros, zeros, T([1.0, 3.0]), mask, agg="seq-mean-token-mean")
    close(loss, -(1 + 3) / 2)


def test_gspo_sequence_ratio_and_clipping() -> None:
    # row 0: log-ratios 0.1, 0.3 -> s = e^0.2 = 1.2214 > 1 + 4e-4, A = 1 > 0 -> clipped: l = -(1 + 4e-4)
    # row 1: log-ratios 1e-4, -3e-4, 5e-5 -> mean -5e-5, s = e^-5e-5 inside [1 - 3e-4, 1 + 4e-4]: l = -2 s
    old = torch.zeros(2, 4)
    logp = T([[0.1, 0.3, 0.0, 0.0], [1e-4, -3e-4, 5e-5, 0.0]], dtype=torch.float64).requires_grad_()
    mask = T([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    adv = T([1.0, 2.0], dtype=torch.float64)
    loss, m = gspo_policy_loss(logp, old.double(), adv, mask)
    s1 = math.exp(-5e-5)
    close(loss, (-(1 + 4e-4) + -2 * s1) / 2)
    close(m["ratio_max"], math.exp(0.2))
    close(m["ratio_min"], s1)
    close(m["pg_clipfrac"], 2 / 5)
    loss.backward()
    # sequence-level GSPO gradient: clipped row 0 gets 0; row 1 tokens get -A s / |y| / #sequences
    g = -2 * s1 / 3 / 2
    close(logp.grad, [[0.0, 0.0, 0.0, 0.0], [g, g, g, 0.0]])


def test_gspo_gradient_equals_sequence_level_formula() -> None:
    # unclipped (wide clip): grad of GSPO-token == grad of -mean_i A_i exp(mean_t (logp - old)) (paper Eq. 5)
    torch.manual_seed(0)
    logp = (torch.randn(3, 5, dtype=torch.float64) * 0.1).requires_grad_()
    old = torch.randn(3, 5, dtype=torch.float64) * 0.1
    mask = T([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)
    adv = T([0.5, -1.0, 2.0], dtype=torch.float64)
    loss, _ = gspo_policy_loss(logp, old, adv, mask, clip_low=10.0, clip_high=10.0)
    (grad,) = torch.autograd.grad(loss, logp)
    ref = logp.detach().clone().requires_grad_()
    seq_ratio = torch.stack([torch.exp((ref[i] - old[i])[mask[i]].mean()) for i in range(3)])
    ref_loss = -(adv * seq_ratio).mean()
    ref_loss.backward()
    close(loss, ref_loss.item())
    torch.testing.assert_close(grad, ref.grad)


def test_gspo_seq_ids_split_turns() -> None:
    # one trajectory row, two turns separated by observation tokens: log-ratios [0.2, 0.4] and [-0.1]
    mask = T([[0, 1, 1, 0, 1]], dtype=torch.bool)
    seq = segment_ids(mask)
    assert seq.tolist() == [[0, 1, 1, 0, 2]]
    logp = T([[7.0, 0.2, 0.4, 7.0, -0.1]])
    loss, m = gspo_policy_loss(logp, torch.zeros(1, 5), T([1.0]), mask, clip_low=1.0, clip_high=1.0, seq_ids=seq)
    # turns: s = e^0.3 and e^-0.1, each a sequence: loss = mean(-e^0.3, -e^-0.1)
    close(loss, -(math.exp(0.3) + math.exp(-0.1)) / 2)
    close(m["ratio_mean"], (math.exp(0.3) + math.exp(-0.1)) / 2)
    # whole row as one sequence: s = e^((0.2 + 0.4 - 0.1) / 3)
    loss, _ = gspo_policy_loss(logp, torch.zeros(1, 5), T([1.0]), mask, clip_low=1.0, clip_high=1.0)
    close(loss, -math.exp(0.5 / 3))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("k1", [0.5, -0.5]),
        ("kl", [0.5, -0.5]),
        ("abs", [0.5, 0.5]),
        ("k2", [0.125, 0.125]),
        ("mse", [0.125, 0.125]),
        # ref - logp = -0.5, 0.5: e^-0.5 + 0.5 - 1, e^0.5 - 0.5 - 1
        ("k3", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5]),
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5]),
    ],
)
def test_kl_kinds(kind: str, expected: list[float]) -> None:
    close(kl_penalty(T([0.0, -1.0]), T([-0.5, -0.5]), kind), expected)  # type: ignore[arg-type]


def test_kl_k3_clamp_and_unknown() -> None:
    # ref - logp = 15: e^15 - 16 is huge -> clamped to 10; = 30 would overflow without the [-20, 20] clamp
    close(kl_penalty(T([0.0, 0.0]), T([15.0, 1e4]), "k3"), [10.0, 10.0])
    with pytest.raises(ValueError, match="unknown KL kind"):
        kl_penalty(T([0.0]), T([0.0]), "k4")  # type: ignore[arg-type]


def test_entropy_from_logits() -> None:
    logits = T([[0.0, 0.0, 0.0, 0.0], [1000.0, 1000.0, -float("inf"), -float("inf")], [math.log(3.0), 0.0, 0.0, 0.0]])
    logits.requires_grad_()
    h = entropy_from_logits(logits)
    # uniform over 4: log 4; two equal finite logits: log 2; p = [1/2, 1/6, 1/6, 1/6]
    close(h, [math.log(4.0), math.log(2.0), 0.5 * math.log(2) + 3 * (1 / 6) * math.log(6)])
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_value_loss_clipping() -> None:
    values, old, ret = T([[1.0, 1.0, 2.0, 50.0]]), T([[0.0, 0.0, 2.0, 0.0]]), T([[0.0, 2.0, 5.0, 0.0]])
    mask = T([[1, 1, 1, 0]], dtype=torch.bool)
    loss, m = value_loss(values, old, ret, mask, clip=0.2)
    # t0: (1-0)^2 = 1 vs (0.2-0)^2 = 0.04 -> 1;  t1: (1-2)^2 = 1 vs (0.2-2)^2 = 3.24 -> 3.24 (clipped)
    # t2: v = old: 9 both; t3 off the mask
    close(loss, 0.5 * (1 + 3.24 + 9) / 3)
    close(m["vf_clipfrac"], 1 / 3)
    close(m["vpred_mean"], 4 / 3)
    loss, m = value_loss(values, old, ret, mask, clip=None)
    close(loss, 0.5 * (1 + 1 + 9) / 3)
    close(m["vf_clipfrac"], 0.0)
