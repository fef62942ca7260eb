"""Parsing of `<answer>...</answer>` replies, shared by the grid-game envs (Sokoban, FrozenLake).

The format follows RAGEN/ROLL: the model may think freely, but its move must sit inside an answer tag,
e.g. ``<answer>Left</answer>`` or, where several moves per turn are allowed, ``<answer>Up || Right</answer>``.
Anything else is an invalid action (the caller applies its format penalty); this module never raises on
model output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")

OPEN_TAG = "<answer>"
CLOSE_TAG = "</answer>"
ACTION_SEPARATOR = "||"


def extract_answer(text: str) -> str | None:
    """The lower-cased content of the last ``<answer>...</answer>`` block, or None if there is none.

    Tags match case-insensitively. We scan with ``rfind`` instead of a regex: a non-greedy regex is
    quadratic on adversarial input such as ``"<answer>" * 100_000`` with no closing tag, and a reply
    is untrusted model output.
    """
    if not isinstance(text, str):
        return None
    # Lower-case once and slice that same string: `str.lower` can change lengths for some code points,
    # so indices found in the lowered text must not be used on the original.
    lowered = text.lower()
    end = lowered.rfind(CLOSE_TAG)
    if end < 0:
        return None
    start = lowered.rfind(OPEN_TAG, 0, end)
    if start < 0:
        return None
    return lowered[start + len(OPEN_TAG) : end]


def parse_actions(text: str, vocabulary: Mapping[str, T], max_actions: int = 1) -> list[T] | None:
    """Map the answer in ``text`` to 1..``max_actions`` actions, or None when the reply is invalid.

    ``vocabulary`` maps lower-case action words to actions. The answer is split on ``||``; every part,
    stripped of surrounding whitespace, must be a known word, and there must be at most ``max_actions``
    parts (a longer plan is rejected rather than truncated, so the model learns the limit).
    """
    content = extract_answer(text)
    if content is None:
        return None
    parts = [part.strip() for part in content.split(ACTION_SEPARATOR)]
    if not 1 <= len(parts) <= max_actions:
        return None
    actions = []
    for part in parts:
        if part not in vocabulary:
            return None
        actions.append(vocabulary[part])
    return actions


def first_action_word(text: str, vocabulary: Mapping[str, T]) -> list[T] | None:
    """The lenient parse: the first whole word of ``text`` that is an action word, as a one-action list.

    Tiny models trained from scratch never discover the ``<answer>`` form by sampling (see the learning
    recipe in ``configs/frozenlake_learn.yaml``); real chat models should use `parse_actions`. Words are
    runs of letters, matched case-insensitively, so ``"<answer>Left</answer>"`` and ``"left up"`` both give Left.
    """
    if not isinstance(text, str):
        return None
    for word in re.findall(r"[^\W\d_]+", text[:4096]):
        action = vocabulary.get(word.lower())
        if action is not None:
            return [action]
    return None
