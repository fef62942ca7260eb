"""`TurnCache`: each conversation's KV cache kept between its turns, so a turn costs its new tokens.

An entry holds the tokens a conversation's last generation ended on (prompt + reply but its last token, which was
never fed back) and their keys and values, per layer. The next turn's prompt reuses the longest prefix it shares
with them. Entries are bounded in bytes, the least recently used evicted first, and every entry belongs to one
policy version: a weight load empties the cache, since keys and values computed by other weights would give other
log-probs.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

GIB = 1 << 30


@dataclass
class TurnKV:
    """A conversation's cached tokens and their keys/values, ``layers[i] = (keys, values)`` each [heads, n, dim]."""

    tokens: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    version: int

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.layers)

    def reusable(self, prompt: list[int]) -> int:
        """How many of ``prompt``'s first tokens these keys/values cover (at most all but its last, whose logits
        the reply's first token needs)."""
        limit = min(len(self.tokens), len(prompt) - 1)
        n = 0
        while n < limit and self.tokens[n] == prompt[n]:
            n += 1
        return n


class TurnCache:
    """Conversation key -> `TurnKV`, at most ``gib`` GiB in all (0: off)."""

    def __init__(self, gib: float) -> None:
        self.limit = int(gib * GIB)
        self._entries: OrderedDict[str, TurnKV] = OrderedDict()
        self._bytes = 0
        self.counters = {"reused_tokens": 0, "prefilled_tokens": 0, "evictions": 0}

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: str, prompt: list[int], version: int) -> tuple[TurnKV | None, int]:
        """Remove ``key``'s entry and say how much of ``prompt`` it covers (its generation stores a new one)."""
        entry = self._entries.pop(key, None) if key else None
        if entry is not None:
            self._bytes -= entry.nbytes
        reused = entry.reusable(prompt) if entry is not None and entry.version == version else 0
        self.counters["reused_tokens"] += reused
        self.counters["prefilled_tokens"] += len(prompt) - reused
        return (entry, reused) if reused else (None, 0)

    def put(self, key: str, entry: TurnKV) -> None:
        """Keep ``entry`` as ``key``'s, evicting the least recently used until all fit (one too large is dropped)."""
        if not key or not self.enabled:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        size = entry.nbytes
        if size > self.limit:
            return
        while self._bytes + size > self.limit and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes
            self.counters["evictions"] += 1
        self._entries[key] = entry
        self._bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0
