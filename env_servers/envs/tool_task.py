"""One turn of a tool task (the calculator and lookup envs): the reward, the truncation and what the agent is
told, from whether the reply made a call and whether a call solved the task."""

from __future__ import annotations


def tool_turn(valid: bool, done: bool, t: int, max_steps: int, penalty: float, hint: str) -> tuple[float, bool, str]:
    """``(reward, truncated, text)`` after turn ``t``: 1 when solved, 0 for a call that did not solve it, the
    format ``penalty`` for a reply without a call (told ``hint``, the calls it may make); the turns left."""
    reward = (1.0 if done else 0.0) if valid else penalty
    left = max_steps - t
    text = (
        "Correct."
        if done
        else ("" if valid else f"Reply with tool calls: {hint}. ") + (f"{left} turn{'s' if left != 1 else ''} left.")
    )
    return reward, not done and t >= max_steps, text
