"""One turn of a tool task (calculator, lookup): reward, truncation and feedback text."""

from __future__ import annotations


def tool_turn(valid: bool, done: bool, t: int, max_steps: int, penalty: float, hint: str) -> tuple[float, bool, str]:
    """``(reward, truncated, text)`` after turn ``t``: 1 solved, 0 a call that did not solve it, ``penalty`` for
    a reply without a call."""
    reward = (1.0 if done else 0.0) if valid else penalty
    left = max_steps - t
    text = (
        "Correct."
        if done
        else ("" if valid else f"Reply with tool calls: {hint}. ") + (f"{left} turn{'s' if left != 1 else ''} left.")
    )
    return reward, not done and t >= max_steps, text
