"""Forward helpers: chunked log-probs equal a whole log-softmax; micro-batch plans cover every row once, and the
token-budget plan is the cheapest split."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given
from hypothesis import strategies as st

from roll_lightning.training import AlgorithmConfig
from roll_lightning.training.forward import TokenBudgetMicroBatches, target_logprobs, token_logprobs


def test_chunked_logprobs_and_entropy_equal_the_whole_computation() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 11, 17, requires_grad=True)
    ids = torch.randint(0, 17, (3, 11))
    logp, entropy = token_logprobs(logits, ids, 0.7, with_entropy=True, chunk=4)
    full = torch.log_softmax(logits[:, :-1] / 0.7, -1)
    expected = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(logp[:, 1:], expected)
    torch.testing.assert_close(entropy[:, 1:], -(full.exp() * full).sum(-1))
    assert bool((logp[:, 0] == 0).all())
    logp.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_suppressed_ids_leave_the_entropy_and_its_gradient_finite() -> None:
    """A vision model's picture placeholders are never sampled: masked to -inf, they count as p = 0 in the
    entropy (a plain sum of p * logit would be 0 * -inf = NaN)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 9, requires_grad=True)
    targets = torch.randint(0, 7, (2, 5))
    logp, entropy = target_logprobs(logits, targets, 1.0, with_entropy=True, suppressed=[7, 8])
    kept = torch.log_softmax(logits[..., :7], -1)
    torch.testing.assert_close(entropy, -(kept.exp() * kept).sum(-1))
    torch.testing.assert_close(logp, kept.gather(-1, targets[..., None]).squeeze(-1))
    (logp.sum() + entropy.sum()).backward()
    assert torch.isfinite(logits.grad).all()


@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    budget=st.integers(1, 2000),
    mode=st.sampled_from(["fixed", "token_budget"]),
)
def test_micro_batch_plans_cover_every_row_exactly_once_within_budget(
    lengths: list[int], budget: int, mode: str
) -> None:
    config = AlgorithmConfig(micro_batching=mode, max_tokens_per_micro=budget, micro_batch_size=3)  # type: ignore[arg-type]
    plans = config.micro_batcher.plan(lengths)
    assert sorted(i for plan in plans for i in plan) == list(range(len(lengths)))
    for plan in plans:
        if mode == "fixed":
            assert len(plan) <= 3
        elif len(plan) > 1:  # a row longer than the budget may sit alone; groups stay within it
            assert len(plan) * max(lengths[i] for i in plan) <= budget


def _plan_cost(plans: list[list[int]], lengths: list[int], pass_tokens: int) -> int:
    return sum(pass_tokens + len(plan) * max(lengths[i] for i in plan) for plan in plans)


@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=9),
    budget=st.integers(1, 200),
    pass_tokens=st.integers(0, 100),
)
def test_the_token_budget_plan_is_the_cheapest_split_of_the_sorted_rows(
    lengths: list[int], budget: int, pass_tokens: int
) -> None:
    """Padded tokens plus ``pass_tokens`` a forward pass: no split of the rows, sorted longest first, into runs
    within the budget costs less (every split tried)."""
    plans = TokenBudgetMicroBatches(budget, pass_tokens).plan(lengths)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = None
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        runs, start = [], 0
        for k, cut in enumerate(cuts, 1):
            if cut:
                runs.append(order[start:k])
                start = k
        runs.append(order[start:])
        if all(len(run) == 1 or len(run) * lengths[run[0]] <= budget for run in runs):
            cost = _plan_cost(runs, lengths, pass_tokens)
            best = cost if best is None else min(best, cost)
    assert _plan_cost(plans, lengths, pass_tokens) == best


def test_trajectory_rows_of_one_and_eight_turns_train_in_separate_passes() -> None:
    """The case that made the split pay (docs/benchmarks.md, issue 52): 4 long rows and 28 short ones fit one
    8,192-token pass, which would pad each short row eightfold; two passes compute 1,320 tokens, not 5,632."""
    lengths = [176] * 4 + [22] * 28
    plans = TokenBudgetMicroBatches(8192, pass_tokens=256).plan(lengths)
    assert sorted(map(sorted, plans)) == [list(range(4)), list(range(4, 32))]
    assert TokenBudgetMicroBatches(8192, pass_tokens=8192).plan(lengths) == [
        sorted(range(32), key=lambda i: -lengths[i])
    ]


def test_the_policy_forward_runs_the_head_only_where_replies_are_predicted(model_dir, tokenizer) -> None:
    """`policy_forward` (``logits_to_keep``) gives the reply tokens' log-probs and entropies of a full forward, with
    their gradients, and 0 off the replies."""
    from transformers import AutoModelForCausalLM

    from roll_lightning.checks.handmade import handmade_batch
    from roll_lightning.training.forward import policy_forward

    batch = handmade_batch(model_dir, tokenizer, groups=2, layout="step")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    logp, entropy = policy_forward(model, batch, 0.7, with_entropy=True)
    full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    expected, expected_entropy = token_logprobs(full.logits, batch.input_ids, 0.7, with_entropy=True)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(logp[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], expected_entropy[mask], atol=1e-5, rtol=1e-5)
    assert bool((logp[~mask] == 0).all()) and bool((entropy[~mask] == 0).all())
    head = model.get_output_embeddings().weight
    (grad,) = torch.autograd.grad(logp[mask].sum(), head, retain_graph=True)
    (expected_grad,) = torch.autograd.grad(expected[mask].sum(), head)
    torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-4)
