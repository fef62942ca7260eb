"""Parsing of RAGEN/ROLL-style `<answer>Left</answer>` (or `<answer>Up || Right</answer>`) replies for the grid
envs. Never raises on model output; anything unparsable is None (an invalid action)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")

OPEN_TAG = "<answer>"
CLOSE_TAG = "</answer>"
ACTION_SEPARATOR = "||"


def extract_answer(text: str) -> str | None:
    """The lower-cased content of the last ``<answer>...</answer>`` block, or None.

    ``rfind``, not a regex: a non-greedy regex is quadratic on untrusted input like ``"<answer>" * 100_000``.
    """
    if not isinstance(text, str):
        return None
    # `str.lower` can change lengths, so slice the lowered string, not the original.
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

    A plan longer than ``max_actions`` is rejected, not truncated, so the model learns the limit.
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
    """The lenient parse: the first word of ``text`` that is an action word, as a one-action list.

    For tiny models trained from scratch, which never discover the ``<answer>`` form by sampling
    (``configs/frozenlake_learn.yaml``).
    """
    if not isinstance(text, str):
        return None
    for word in re.findall(r"[^\W\d_]+", text[:4096]):
        action = vocabulary.get(word.lower())
        if action is not None:
            return [action]
    return None
