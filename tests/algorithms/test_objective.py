"""`algorithms.objective`: the loss and its gradient do not depend on how rows are split into micro-batches.

The whole grid: every policy loss x aggregation x extra term (none, KL, entropy, critic) x split (one row per
micro-batch, two padded halves, rows sorted by length and trimmed to each micro-batch's own width, as the
token-budget planner does), against the batch taken whole. Inputs are leaf tensors (the log-probs, entropies
and values a forward pass would give), so the gradient compared is the loss's own.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll_lightning.algorithms import POLICY_LOSSES
from roll_lightning.algorithms.aggregation import AGG_MODES, AGGREGATIONS, aggregate
from roll_lightning.algorithms.grouping import segment_ids
from roll_lightning.algorithms.losses import gspo_policy_loss, kl_penalty, ppo_policy_loss
from roll_lightning.algorithms.objective import MicroInputs, Objective
from roll_lightning.algorithms.policy_loss import GSPO, PolicyLoss

LOSSES = ("ppo", "gspo", "gspo-turn")
EXTRAS = ("none", "kl", "entropy", "critic")
SPLITS = ("rows", "halves", "trimmed")


def inputs(seed: int, rows: int = 6, width: int = 12) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, width + 1, (rows,), generator=g)
    prompt = torch.randint(1, 4, (rows,), generator=g)
    positions = torch.arange(width)
    mask = (positions >= prompt[:, None]) & (positions < lengths[:, None])
    mask[0] = False  # a row without a reply token: it must not count in any denominator
    odd = torch.arange(1, rows, 2)
    mask[odd, prompt[odd] + 2] = False  # odd rows: two turns with an observation token between them

    def leaf(scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(rows, width, generator=g) * scale).requires_grad_(True)

    return {
        "lengths": lengths,
        "mask": mask,
        "logp": leaf(0.5),
        "old_logp": torch.randn(rows, width, generator=g) * 0.5,
        "advantages": torch.randn(rows, generator=g),
        "entropy": leaf(),
        "ref_logp": torch.randn(rows, width, generator=g) * 0.5,
        "values": leaf(),
        "old_values": torch.randn(rows, width, generator=g),
        "returns": torch.randn(rows, width, generator=g),
    }


def policy(loss: str, clip: tuple[float, float]) -> PolicyLoss:
    """``gspo-turn``: GSPO with one sequence per turn (``gspo_per_turn``)."""
    if loss == "gspo-turn":
        return GSPO(clip_low=clip[0], clip_high=clip[1], per_turn=True)
    return POLICY_LOSSES[loss](clip_low=clip[0], clip_high=clip[1])


def objective(loss: str, aggregation: str, extra: str) -> Objective:
    clip = (0.2, 0.28) if loss == "ppo" else (3e-4, 4e-4)
    return Objective(
        policy=policy(loss, clip), aggregation=AGGREGATIONS[aggregation],
        kl_coef=0.1 if extra == "kl" else 0.0, entropy_coef=0.01 if extra == "entropy" else 0.0,
        value_coef=0.5 if extra == "critic" else 0.0,
    )  # fmt: skip


def micro(x: dict[str, torch.Tensor], rows: list[int], extra: str, trim: bool) -> MicroInputs:
    width = int(x["lengths"][rows].max()) if trim else x["mask"].shape[1]

    def cut(name: str) -> torch.Tensor:
        return x[name][rows][:, :width] if x[name].dim() == 2 else x[name][rows]

    return MicroInputs(
        logp=cut("logp"), old_logp=cut("old_logp"), advantages=cut("advantages"), mask=cut("mask"),
        entropy=cut("entropy") if extra == "entropy" else None, ref_logp=cut("ref_logp") if extra == "kl" else None,
        values=cut("values") if extra == "critic" else None, old_values=cut("old_values"), returns=cut("returns"),
    )  # fmt: skip


def plans(x: dict[str, torch.Tensor], split: str) -> list[list[int]]:
    n = x["mask"].shape[0]
    if split == "rows":
        return [[i] for i in range(n)]
    if split == "halves":
        return [list(range(n // 2)), list(range(n // 2, n))]
    order = sorted(range(n), key=lambda i: -int(x["lengths"][i]))
    return [order[:1], order[1:4], order[4:]]


def loss_and_grads(obj: Objective, x: dict[str, torch.Tensor], groups: list[list[int]], extra: str, trim: bool):
    leaves = [x[name] for name in ("logp", "entropy", "values")]
    for leaf in leaves:
        leaf.grad = None
    divisors = obj.divisors(x["mask"])
    total = sum(obj(micro(x, rows, extra, trim), divisors)[0] for rows in groups)
    total.backward()
    return total.detach(), [leaf.grad.clone() if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]


@pytest.mark.parametrize(
    ("loss", "aggregation", "extra", "split"), list(itertools.product(LOSSES, AGG_MODES, EXTRAS, SPLITS))
)
def test_the_loss_and_its_gradient_do_not_depend_on_the_micro_batches(
    loss: str, aggregation: str, extra: str, split: str
) -> None:
    x = inputs(seed=len(loss) + len(aggregation) + len(extra))
    obj = objective(loss, aggregation, extra)
    whole, whole_grads = loss_and_grads(obj, x, [list(range(x["mask"].shape[0]))], extra, trim=False)
    parts, part_grads = loss_and_grads(obj, x, plans(x, split), extra, trim=split == "trimmed")
    torch.testing.assert_close(parts, whole, rtol=1e-6, atol=1e-7)
    for a, b in zip(part_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    assert any(float(g.abs().sum()) > 0 for g in whole_grads)  # there was a gradient to compare


@pytest.mark.parametrize("aggregation", AGG_MODES)
def test_the_whole_batch_objective_is_the_documented_formula(aggregation: str) -> None:
    """Taken whole, the objective is P + c_kl K - c_H H: the aggregated losses the docstrings define."""
    x = inputs(seed=7)
    mask, logp, old = x["mask"], x["logp"], x["old_logp"]
    width = mask.shape[1]
    for loss in LOSSES:
        obj = Objective(
            policy=policy(loss, (0.2, 0.2)),
            aggregation=AGGREGATIONS[aggregation],
            kl_coef=0.1,
            entropy_coef=0.01,
        )
        got, _ = obj(micro(x, list(range(6)), "kl", trim=False), obj.divisors(mask))
        got_h, _ = obj(micro(x, list(range(6)), "entropy", trim=False), obj.divisors(mask))
        if loss == "ppo":
            expected, _ = ppo_policy_loss(logp, old, x["advantages"], mask, agg=aggregation, norm_len=width)  # type: ignore[arg-type]
        else:
            seq_ids = segment_ids(mask) if loss == "gspo-turn" else None
            expected, _ = gspo_policy_loss(
                logp, old, x["advantages"], mask, clip_low=0.2, clip_high=0.2, seq_ids=seq_ids
            )
        kl = aggregate(kl_penalty(logp, x["ref_logp"], "low_var_kl"), mask, aggregation, norm_len=width)  # type: ignore[arg-type]
        entropy = aggregate(x["entropy"], mask, aggregation, norm_len=width)  # type: ignore[arg-type]
        torch.testing.assert_close(got, expected + 0.1 * kl)
        torch.testing.assert_close(got_h, expected - 0.01 * entropy)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), cut=st.integers(1, 5), loss=st.sampled_from(LOSSES))
def test_any_two_way_split_is_exact(seed: int, cut: int, loss: str) -> None:
    x = inputs(seed)
    obj = objective(loss, "seq-mean-token-sum-norm", "kl")
    whole, whole_grads = loss_and_grads(obj, x, [list(range(6))], "kl", trim=False)
    parts, part_grads = loss_and_grads(obj, x, [list(range(cut)), list(range(cut, 6))], "kl", trim=True)
    # float32 sums in another order: a few ulps of the loss apart (9e-6 relative seen by hypothesis)
    torch.testing.assert_close(parts, whole, rtol=2e-5, atol=1e-7)
    torch.testing.assert_close(part_grads[0], whole_grads[0], rtol=1e-6, atol=1e-8)
