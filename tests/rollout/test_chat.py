"""Prompt rendering keeps the trainer's tokens identical to the engine's (no tokenisation drift)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from roll_lightning.rollout.episodes.episode import Episode, Turn
from roll_lightning.rollout.episodes.layout import LAYOUTS, STEP, TRAJECTORY, layout_named
from roll_lightning.rollout.prompts.chat import PromptConfig, TemplateDriftError, TokenHistory, render, renders_tools

SYSTEM = {"role": "system", "content": "You play games."}


def _play(tokenizer: Any, replies: list[str]) -> TokenHistory:
    history = TokenHistory(tokenizer, messages=[dict(SYSTEM)])
    eos = tokenizer.eos_token_id
    for k, reply in enumerate(replies):
        history.add_user(f"Turn {k + 1}:\n#####\n#P_O#\n#_X√#\n#####")
        history.add_reply(tokenizer.encode(reply, add_special_tokens=False) + [eos], {eos})
    return history


def test_history_ids_equal_the_template_tokenisation_of_the_whole_conversation(tokenizer: Any) -> None:
    history = _play(tokenizer, ["<answer>Left</answer>", "<think>box is right</think><answer>Up</answer>", "Down"])
    history.add_user("Turn 4:\n#####")  # the next prompt: ends with the assistant header
    whole = render(tokenizer, history.messages, generation_prompt=True)
    assert history.text == whole
    assert history.ids == tokenizer.encode(whole, add_special_tokens=False)
    assert whole.endswith("<|im_start|>assistant\n")


def test_sampled_reply_ids_are_kept_verbatim_and_text_still_matches(tokenizer: Any) -> None:
    """A reply in a non-canonical tokenisation ("Le"+"ft" instead of "Left") is kept as sampled: the text the
    ids stand for is still exactly the template's rendering of the conversation."""
    eos = tokenizer.eos_token_id
    pieces = [tokenizer.encode(p, add_special_tokens=False) for p in ["<answer>", "Le", "ft", "</answer>"]]
    reply_ids = [i for p in pieces for i in p] + [eos]
    history = TokenHistory(tokenizer, messages=[dict(SYSTEM)])
    first_prompt = list(history.add_user("Turn 1: go"))
    history.add_reply(reply_ids, {eos})
    before = list(history.ids)
    history.add_user("Turn 2: again")
    assert history.ids[: len(before)] == before  # earlier prompts are prefixes of later ones
    assert history.ids[len(first_prompt) : len(first_prompt) + len(reply_ids)] == reply_ids
    assert tokenizer.decode(history.ids, skip_special_tokens=False) == render(
        tokenizer, history.messages, generation_prompt=True
    )
    assert history.messages[-2] == {"role": "assistant", "content": "<answer>Left</answer>"}


def test_reply_cut_by_the_length_limit_is_closed_by_the_template(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    history = TokenHistory(tokenizer, messages=[dict(SYSTEM)])
    history.add_user("Turn 1")
    history.add_reply(tokenizer.encode("<answer>Le", add_special_tokens=False), {eos})  # no eos: hit max tokens
    delta = tokenizer.decode(history.add_user("Turn 2"), skip_special_tokens=False)
    assert delta.startswith("<|im_end|>")


def test_a_template_that_rewrites_old_turns_is_refused_with_advice(tokenizer: Any) -> None:
    class ForgetfulTemplate:
        """Drops the content of all but the last assistant turn (as some reasoning templates do)."""

        eos_token_id = tokenizer.eos_token_id

        def apply_chat_template(self, messages: list[dict[str, str]], **kw: Any) -> str:
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            trimmed = [
                {**m, "content": "" if m["role"] == "assistant" and i != last else m["content"]}
                for i, m in enumerate(messages)
            ]
            return tokenizer.apply_chat_template(trimmed, **kw)

        def encode(self, text: str, **kw: Any) -> list[int]:
            return tokenizer.encode(text, **kw)

        def decode(self, ids: list[int], **kw: Any) -> str:
            return tokenizer.decode(ids, **kw)

    history = TokenHistory(ForgetfulTemplate(), messages=[dict(SYSTEM)])
    eos = tokenizer.eos_token_id
    history.add_user("Turn 1")
    history.add_reply(tokenizer.encode("<answer>Up</answer>", add_special_tokens=False) + [eos], {eos})
    history.add_user("Turn 2")
    history.add_reply(tokenizer.encode("<answer>Up</answer>", add_special_tokens=False) + [eos], {eos})
    with pytest.raises(TemplateDriftError, match="layout 'step'"):
        history.add_user("Turn 3")


def test_prompt_config_rejects_unknown_placeholders() -> None:
    with pytest.raises(ValueError, match="turn_template"):
        PromptConfig(turn_template="{observation} {nonsense}")


def _episode(rewards: list[float]) -> Episode:
    turns = [
        Turn(prompt_ids=[10 + k, 11 + k], response_ids=[20 + k], logprobs=[-0.5], finish_reason="stop",
             policy_version=3 - k, observation=f"board {k}", reward=r)
        for k, r in enumerate(rewards)
    ]  # fmt: skip
    return Episode(group_index=0, member=0, seed=1, env_id="sokoban", turns=turns)


def test_a_layout_is_chosen_once_by_name_and_stays_itself_when_sent_to_another_rank() -> None:
    assert layout_named("step") is STEP and layout_named(TRAJECTORY) is TRAJECTORY
    assert pickle.loads(pickle.dumps(STEP)) is STEP
    with pytest.raises(ValueError, match="unknown row layout 'steps': choose one of trajectory, step"):
        layout_named("steps")
    assert set(LAYOUTS) == {"trajectory", "step"}


def test_trajectory_rows_hold_the_episode_and_step_rows_one_turn_each() -> None:
    episode = _episode([0.0, 1.0, 2.0])
    (whole,) = TRAJECTORY.rows(episode)
    assert whole.ids == [10, 11, 20, 11, 12, 21, 12, 13, 22]
    assert whole.response == [False, False, True] * 3
    assert whole.rewards == [(2, 0.0), (5, 1.0), (8, 2.0)]
    assert (whole.step, whole.step_score, whole.version, whole.anchor) == (3, 3.0, 1, "board 0")
    assert list(TRAJECTORY.turns_of_row(whole.step)) == [0, 1, 2]
    steps = STEP.rows(episode)
    assert [r.ids for r in steps] == [[10, 11, 20], [11, 12, 21], [12, 13, 22]]
    assert [(r.step, r.step_score, r.version, r.anchor) for r in steps] == [
        (0, 0.0, 3, "board 0"), (1, 1.0, 2, "board 1"), (2, 2.0, 1, "board 2"),
    ]  # fmt: skip
    assert [list(STEP.turns_of_row(r.step)) for r in steps] == [[0], [1], [2]]
    assert TRAJECTORY.rows(_episode([])) == [] == STEP.rows(_episode([]))


def test_a_template_that_ignores_tools_gets_the_list_in_its_system_turn(tokenizer: Any) -> None:
    """SmolLM2's template ignores ``tools=``: the list then ends the system message, in the Hermes format; a
    template that renders tools itself (the tiny models', as Qwen2.5's) is left to do so, once."""
    import copy

    tools = [{"type": "function", "function": {"name": "calculate", "description": "add up", "parameters": {}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 3?"}]
    own = render(tokenizer, messages, generation_prompt=True, tools=tools)
    assert renders_tools(tokenizer) and own.count('"name": "calculate"') == 1
    plain = copy.copy(tokenizer)
    plain.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    assert not renders_tools(plain)
    text = render(plain, messages, generation_prompt=True, tools=tools)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n") and text.count('"name": "calculate"') == 1
    assert "<tool_call></tool_call> XML tags" in text and text.endswith(
        "<|im_start|>user\n2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    alone = render(plain, messages[1:], generation_prompt=False, tools=tools)
    assert alone.startswith("<|im_start|>system\n# Tools\n")
    assert render(plain, messages, generation_prompt=True) == render(plain, messages, generation_prompt=True, tools=[])
