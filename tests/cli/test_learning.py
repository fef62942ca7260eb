"""It learns: the CPU recipes, shortened, lift held-out success (the main command's Sokoban, and FrozenLake).

The full recipes run 30 minutes (Sokoban, the main command) and 15 minutes (FrozenLake) per estimator
(bench/learning_curve.py, docs/benchmarks.md). Here each runs a few hundred rollout steps with fixed seeds,
evaluating held-out seeds before the first update and at the end (Sokoban also at step 100). The
rollout is not bit-reproducible (the engine batches whatever requests are waiting, so the random draws land
differently), hence margins, not golden values; each margin is set against the benchmark runs, named beside it.
The runs start with the suite, at the lowest CPU priority, and these tests run last (`support.recipes`,
``tests/conftest.py``); the SmolLM2 run starts last, alone.
"""

from __future__ import annotations

import re
import statistics

import pytest
from support.recipes import HANG_GUARD_S, RECIPES, Recipe

# the tests wait for runs started with the suite (conftest's learning_recipes)
pytestmark = pytest.mark.timeout(HANG_GUARD_S)


@pytest.fixture(scope="module", autouse=True)
def start_the_runs_that_run_alone(learning_recipes: dict[str, Recipe]) -> None:
    """Before this module's first test, the rest of the suite done: the SmolLM2 run, on every core."""
    for recipe in learning_recipes.values():
        if recipe.alone:
            recipe.start()


def mean(key: str, part: list[dict[str, str]]) -> float:
    return sum(float(r[key]) for r in part) / len(part)


def median(key: str, part: list[dict[str, str]]) -> float:
    """The typical step: a transient spike (seen once in CI: invalid replies at 0 for 230 steps, then 0.79 at step
    385 for one update that moved the policy too far, back to 0 by step 396) moves the mean, not the median."""
    return statistics.median(float(r[key]) for r in part)


def test_the_main_command_learns_sokoban(learning_recipes: dict[str, Recipe]) -> None:
    """`configs/sokoban.yaml` as written, cut to its first 200 rollout steps of 128 episodes (the 30-minute run does
    ~700-1,100) with no wall-clock budget (the run shares the machine with the rest of the suite), evaluated on 512
    held-out levels instead of 128, at steps 0, 100 and 200.

    The policy's move prior wanders from update to update, so one evaluation moves by several points by itself
    (128 levels at temperature 1: about +-4; the same weights read 3.1% and 8.6% at step 0 in two runs), and the
    mean of the evaluations after step 0 is the steadier measure. Over ten 30-minute seeds of the recipe (five on a
    2-core AMD EPYC, docs/benchmarks.md "Thirty-two levels of four"; five on an Intel Xeon, "The main command over
    five seeds on a CPU with AMX"; 128 held-out levels) the mean of steps 100 and 200 stood +9.8 to +24.7 points
    over step 0 (median +13.3). Hence a margin of +6: 3.8 points under the worst seed, and about 4 standard errors
    of the 1,024 held-out episodes after step 0 above no change. At steps 150-199 invalid replies had a median of
    0.5-1.1% and training success was up by 6-13 points in nine of the ten seeds; the tenth (Xeon seed 3) was inside
    a burst of invalid replies (steps 117-174, docs/benchmarks.md) that it recovered from, and would fail the two
    assertions on them: a known risk of about one run in ten, kept because a policy that never learned valid moves
    must fail here. 200 steps, not 400: the 400-step test doubled the suite's learning compute when the recipe went
    to 128 episodes a step. Training success per batch is noisier, so it only may not fall. The FrozenLake test
    below covers a policy that reads its board in a CI budget."""
    steps = RECIPES["test_the_main_command_learns_sokoban"][1]
    recipe = learning_recipes["test_the_main_command_learns_sokoban"]
    evals, train, stdout = recipe.result()
    before, after = evals[0][1], evals[-1][1]
    assert statistics.mean(v for _, v in evals[1:]) - before >= 0.06, recipe.diagnosis()
    first, last = train[:50], train[-50:]
    assert median("rollout/invalid_action_rate", last) < 0.05 < mean("rollout/invalid_action_rate", first)
    assert mean("rollout/success_rate", last) >= mean("rollout/success_rate", first), recipe.diagnosis()
    # The terminal says so as it goes: one line per evaluation, the last with the change since the first.
    assert f"held-out success {100 * before:.1f}% after 0 rollout steps" in stdout
    assert f"held-out success {100 * after:.1f}% after {steps} rollout steps" in stdout
    assert f"{100 * (after - before):+.1f} points since the first evaluation" in stdout


def test_the_cpu_recipe_learns_frozenlake(learning_recipes: dict[str, Recipe]) -> None:
    """In the benchmark runs the policy was at +30 and +50 points at 400 steps, while a policy that only learned to
    answer validly gains about +12."""
    recipe = learning_recipes["test_the_cpu_recipe_learns_frozenlake"]
    evals, train, _ = recipe.result()
    (_, before), (_, after) = evals
    assert after - before >= 0.20, recipe.diagnosis()
    first, last = train[:50], train[-50:]
    assert median("rollout/invalid_action_rate", last) < 0.05 < mean("rollout/invalid_action_rate", first)
    assert mean("rollout/success_rate", last) >= mean("rollout/success_rate", first) + 0.15


def check_the_format_is_learned(recipe: Recipe, train_share: float) -> list[dict[str, str]]:
    """The SmolLM2 recipe's format margins: held-out invalid replies from at least 50% to at least 30 points lower at
    the end, and the median of the last three training steps under ``train_share`` of the first two steps' mean.
    Returns the training rows."""
    _, train, stdout = recipe.result()
    invalid = [float(x) / 100 for x in re.findall(r"held-out success .*; invalid replies ([\d.]+)%", stdout)]
    assert len(invalid) == 2, stdout[-3000:]  # before the first update and after the last
    before, after = invalid
    assert before >= 0.5 and after <= before - 0.30, (invalid, recipe.diagnosis())
    first, last = train[:2], train[-3:]
    assert median("rollout/invalid_action_rate", last) < train_share * mean("rollout/invalid_action_rate", first)
    return train


def test_a_chat_model_learns_to_use_tools(learning_recipes: dict[str, Recipe]) -> None:
    """`configs/lookup.yaml` cut to its first 60 rollout steps: `tiny-tools` (the tiny model taught the call
    format, not the task) learns to look up the box it is asked about and answer with the code the tool returned,
    through Hermes tool calls parsed by the trainer and answered by the env. In two runs held-out success
    rose from 3.1% to 76.6% and from 15.6% to 73.4% by step 60, training success from 10-15% (steps 1-10) to
    77-83% (steps 51-60), with 5-6% of calls invalid (docs/benchmarks.md, "A chat model learns to use tools")."""
    evals, train, _ = learning_recipes["test_a_chat_model_learns_to_use_tools"].result()
    (_, before), (_, after) = evals
    assert after - before >= 0.25, evals
    first, last = train[:10], train[-10:]
    assert mean("rollout/success_rate", last) >= mean("rollout/success_rate", first) + 0.2
    # the calls stay well-formed: per step 0-21% invalid; the median of the last 10 steps was 6.6% and 10.5% in
    # two runs on 2026-11-28 (the second failed a bound of 10%), 5-6% in the benchmark's
    assert median("rollout/invalid_tool_call_rate", last) < 0.15
    # fewer guesses: wrong answers fall (a right answer ends its episode, so a batch's right answers are its
    # successes). Not all answers: a build of tiny-tools that seldom answers at first answers more as it learns
    # (CI, 2026-12-01: 26.4 answers per batch at steps 1-10, 33.2 at 51-60, success up from ~15% to ~80%)
    assert mean_wrong_answers(last) < mean_wrong_answers(first)
    assert all(float(r["rollout/tool_calls/lookup"] or 0) > 0 for r in last)


def mean_wrong_answers(part: list[dict[str, str]]) -> float:
    """Answers per batch that did not end their episode: all answers less the batch's successes."""
    wrong = [
        float(r["rollout/tool_calls/answer"] or 0) - float(r["rollout/success_rate"]) * float(r["rollout/episodes"])
        for r in part
    ]
    return sum(wrong) / len(wrong)


def test_a_policy_learns_through_the_users_agent_program(learning_recipes: dict[str, Recipe]) -> None:
    """`configs/agent.yaml` for 60 rollout steps: `examples/agents/goal_agent.py`, a program that talks to the
    policy only through the OpenAI-compatible endpoint, runs once per episode and reports its reward; the policy
    learns from those rewards. In the benchmark run held-out success rose from 4.7% to 46.9% by step 60 and
    training success from 9% (steps 1-10) to 53% (steps 51-60) (docs/benchmarks.md, "Your own agent")."""
    evals, train, _ = learning_recipes["test_a_policy_learns_through_the_users_agent_program"].result()
    (_, before), (_, after) = evals
    assert after - before >= 0.2, evals
    first, last = train[:10], train[-10:]
    assert mean("rollout/success_rate", last) >= mean("rollout/success_rate", first) + 0.2
    assert all(float(r["rollout/goal/episodes"]) == 32 for r in train)  # every episode of every batch, played


def test_the_gpu_recipe_shape_learns_through_vllm(learning_recipes: dict[str, Recipe]) -> None:
    """`configs/frozenlake_vllm.yaml` (the GPU recipe's shape: SmolLM2 in the vLLM engine, each episode one
    trajectory row, GRPO, the weights streamed into vLLM after every update) cut to its first 10 rollout steps of
    episodes of at most 4 turns (8 in the recipe), on 16 held-out boards, in micro-batches of 1024 tokens. It runs
    last and alone, on every core (`support.recipes.ALONE`). It is the suite's one SmolLM2 learning run:
    `configs/frozenlake_llm.yaml`'s curve is in docs/benchmarks.md. This cut, run alone on a 2-core AMD EPYC Zen 3
    (float32 by `dtype: auto`; 8 min 21 s, 845 s of CPU, peak RSS 8.6 GB): held-out invalid replies 75.0% at step 0,
    0.0% at step 10; training replies from a mean of 89% over steps 1-2 to a median of 20% over steps 8-10 (0.23 of
    it); in the clean-clone CI run after it, 75.0% to 9.4% held out and 0.15 in training. The full recipe's first
    run (8 turns, bf16): 78.1% to 14.3% held out, 0.38 in training. Margins: held-out
    invalid replies at least 30 points lower at the end, the median of the last three training steps under 0.6 of
    the first two steps' mean, and the trainer-engine log-prob gap under 0.1 (the run warns above it) at every
    step."""
    train = check_the_format_is_learned(
        learning_recipes["test_the_gpu_recipe_shape_learns_through_vllm"], train_share=0.6
    )
    # the engine samples from the trainer's weights after every sync: bf16 on both sides measures ~0.03, float32 1e-5
    assert max(float(r["train/logprob_gap"]) for r in train if r["train/logprob_gap"]) < 0.1
