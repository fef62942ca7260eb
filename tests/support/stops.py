"""Stop strings for engine tests: one taken from the middle of a reply the engine gave, so it is certain to occur."""

from __future__ import annotations

from typing import Any


def stop_inside(tokenizer: Any, token_ids: list[int], at: int = 3) -> str:
    """A stop string that ends inside the reply: the letters of the first token from ``at`` on that has at least
    two, without the token's leading space (so it may also complete earlier, or across a token boundary)."""
    for token in token_ids[at:]:
        text = tokenizer.decode([token]).strip()
        if len(text) >= 2 and text.isalpha():
            return text
    raise AssertionError(f"no alphabetic token in the reply {tokenizer.decode(token_ids)!r}: pick another prompt")
