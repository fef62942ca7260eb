"""Off-policy correction (`algorithms.correction`): hand-computed weights, and the properties that make it safe
to turn on (weights of 1 change nothing, masking a token equals removing it, padding changes no weight)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from roll_lightning.algorithms import POLICY_LOSSES
from roll_lightning.algorithms.aggregation import AGG_MODES, AGGREGATIONS
from roll_lightning.algorithms.correction import importance_weights
from roll_lightning.algorithms.objective import MicroInputs, Objective
from roll_lightning.training import AlgorithmConfig, TrainingConfigError
from roll_lightning.training.config import CorrectionConfig

# One row: prompt, a 3-token reply (rho = 3, 0.5, 1), an observation, a 2-token reply (rho = 4, 0.25), padding.
MASK = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)
RHO = torch.tensor([[1.0, 3.0, 0.5, 1.0, 1.0, 1.0, 4.0, 0.25, 1.0]])
BEHAVIOUR = torch.full((1, 9), -1.0)
OLD = BEHAVIOUR + RHO.log()


def weights(**kw: object) -> tuple[list[float], list[bool], dict[str, float]]:
    c = importance_weights(OLD, BEHAVIOUR, MASK, **kw)  # type: ignore[arg-type]
    return c.weights[MASK].tolist(), c.mask[MASK].tolist(), {k: float(v) for k, v in c.metrics.items()}


def test_token_weights_truncated_and_masked_by_hand() -> None:
    w, kept, m = weights(mode="truncate", level="token", cap=2.0)
    assert w == pytest.approx([2.0, 0.5, 1.0, 2.0, 0.25]) and all(kept)
    assert m["is_truncated_frac"] == pytest.approx(2 / 5) and m["is_masked_frac"] == 0
    assert m["is_weight_mean"] == pytest.approx((3 + 0.5 + 1 + 4 + 0.25) / 5) and m["is_weight_max"] == 4
    w, kept, m = weights(mode="mask", level="token", cap=2.0)
    assert kept == [False, True, True, False, False]  # 3 > 2, 4 > 2, 0.25 < 1/2
    assert w[1:3] == pytest.approx([0.5, 1.0]) and m["is_masked_frac"] == pytest.approx(3 / 5)


def test_sequence_and_geometric_weights_per_turn_and_per_trajectory_by_hand() -> None:
    w, _, _ = weights(mode="truncate", level="sequence", span="turn", cap=10.0)
    assert w == pytest.approx([1.5, 1.5, 1.5, 1.0, 1.0])  # 3 * 0.5 * 1 ; 4 * 0.25
    w, _, _ = weights(mode="truncate", level="sequence", span="trajectory", cap=10.0)
    assert w == pytest.approx([1.5] * 5)
    w, _, _ = weights(mode="truncate", level="geometric", span="turn", cap=10.0)
    assert w == pytest.approx([1.5 ** (1 / 3)] * 3 + [1.0, 1.0])
    w, kept, _ = weights(mode="mask", level="sequence", span="turn", cap=1.4)
    assert kept == [False, False, False, True, True]  # the first turn's 1.5 leaves [1/1.4, 1.4]
    assert w == pytest.approx([1.0, 1.0, 1.0, 1.0, 1.0])  # (dropped tokens' weight is never used)


def test_weights_leave_the_gradient_alone_and_mode_none_only_measures() -> None:
    c = importance_weights(OLD.requires_grad_(), BEHAVIOUR, MASK, mode="none")
    assert not c.weights.requires_grad and torch.equal(c.weights, torch.ones_like(c.weights))
    assert float(c.metrics["is_weight_max"]) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="cap must be > 1"):
        importance_weights(OLD, BEHAVIOUR, MASK, cap=1.0)


def batch(seed: int, rows: int = 4, width: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, width, generator=g) > 0.3
    mask[:, 0] = False
    return {
        "mask": mask,
        "logp": (torch.randn(rows, width, generator=g) * 0.3).requires_grad_(True),
        "behaviour": torch.randn(rows, width, generator=g) * 0.3,
        "advantages": torch.randn(rows, generator=g),
    }


def loss_and_grad(obj: Objective, x: dict[str, torch.Tensor], old: torch.Tensor, mask: torch.Tensor, corr=None):
    x["logp"].grad = None
    inputs = MicroInputs(
        x["logp"], old, x["advantages"], mask, is_weights=None if corr is None else corr.weights,
        policy_mask=None if corr is None else corr.mask,
    )  # fmt: skip
    loss, _ = obj(inputs, obj.divisors(mask, None if corr is None else corr.mask))
    loss.backward()
    return loss.detach(), x["logp"].grad.clone()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 5000),
    loss=st.sampled_from(["ppo", "gspo"]),
    aggregation=st.sampled_from(AGG_MODES),
    mode=st.sampled_from(["truncate", "mask"]),
    level=st.sampled_from(["token", "sequence", "geometric"]),
)
def test_weights_of_one_change_nothing(seed: int, loss: str, aggregation: str, mode: str, level: str) -> None:
    x = batch(seed)
    obj = Objective(policy=POLICY_LOSSES[loss](clip_low=0.2, clip_high=0.2), aggregation=AGGREGATIONS[aggregation])
    old = x["behaviour"]  # the sampler was the old policy: every ratio is 1
    corr = importance_weights(old, x["behaviour"], x["mask"], mode=mode, level=level)  # type: ignore[arg-type]
    plain = loss_and_grad(obj, x, old, x["mask"])
    corrected = loss_and_grad(obj, x, old, x["mask"], corr)
    torch.testing.assert_close(corrected, plain)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 5000), loss=st.sampled_from(["ppo", "gspo"]), aggregation=st.sampled_from(AGG_MODES))
def test_masking_a_token_equals_removing_it(seed: int, loss: str, aggregation: str) -> None:
    x = batch(seed)
    old = x["behaviour"].clone()
    row, col = [int(i) for i in x["mask"].nonzero()[seed % int(x["mask"].sum())]]
    old[row, col] += math.log(5.0)  # this token's weight is 5: outside [1/2, 2]; every other one is 1
    obj = Objective(policy=POLICY_LOSSES[loss](clip_low=0.2, clip_high=0.2), aggregation=AGGREGATIONS[aggregation])
    corr = importance_weights(old, x["behaviour"], x["mask"], mode="mask", level="token", cap=2.0)
    removed = x["mask"].clone()
    removed[row, col] = False
    masked = loss_and_grad(obj, x, old, x["mask"], corr)
    without = loss_and_grad(obj, x, old, removed)
    torch.testing.assert_close(masked, without)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 5000), pad=st.integers(1, 6), level=st.sampled_from(["token", "sequence", "geometric"]))
def test_padding_changes_no_weight(seed: int, pad: int, level: str) -> None:
    x = batch(seed)
    old = x["behaviour"] + torch.randn_like(x["behaviour"]) * 0.2
    base = importance_weights(old, x["behaviour"], x["mask"], mode="truncate", level=level, span="turn")  # type: ignore[arg-type]
    garbage = torch.full((x["mask"].shape[0], pad), float("nan"))
    wide = importance_weights(
        torch.cat([old, garbage], 1), torch.cat([x["behaviour"], -garbage], 1),
        torch.cat([x["mask"], torch.zeros_like(garbage, dtype=torch.bool)], 1), mode="truncate", level=level,  # type: ignore[arg-type]
    )  # fmt: skip
    torch.testing.assert_close(wide.weights[:, : x["mask"].shape[1]], base.weights)
    assert bool(torch.isfinite(wide.weights).all())


def test_a_correction_without_the_recompute_is_refused_naming_the_keys() -> None:
    with pytest.raises(TrainingConfigError, match=r"model\.algorithm\.correction\.mode=truncate needs .*recompute"):
        AlgorithmConfig(correction=CorrectionConfig(mode="truncate"), recompute_old_logprobs=False)
    with pytest.raises(TrainingConfigError, match=r"model\.algorithm\.correction\.cap must be > 1, got 1\.0"):
        CorrectionConfig(cap=1.0)
