"""`encode`: a tokenizer's ids of a text, remembered per tokenizer.

An env's observations recur (a Sokoban board across a group's episodes and turns, a FrozenLake map, a tool's
fixed answer), and a fast tokenizer's call costs about 0.1 ms whatever the text's length: before this, encoding
prompt texts was 9% of the main command's CPU (py-spy, docs/benchmarks.md). Entries are bounded by their texts'
total length, the least recently used evicted first; a tokenizer whose vocabulary grows starts a fresh memo.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

MAX_CHARS = 1 << 23  # per tokenizer: 8M characters of text (with their ids, tens of MB at most)


class EncodingMemo:
    """Text -> ids of one tokenizer, least recently used out first once the texts pass ``max_chars``."""

    def __init__(self, tokenizer: Any, max_chars: int = MAX_CHARS) -> None:
        self._tokenizer = weakref.ref(tokenizer)
        self.max_chars = max_chars
        self.vocab_size = len(tokenizer)
        self._entries: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0  # texts answered from the memo

    def encode(self, text: str) -> list[int]:
        with self._lock:
            ids = self._entries.get(text)
            if ids is not None:
                self._entries.move_to_end(text)
                self.hits += 1
                return list(ids)
        tokenizer = self._tokenizer()
        assert tokenizer is not None, "the memo outlived its tokenizer"
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        with self._lock:
            if len(text) <= self.max_chars and text not in self._entries:
                self._entries[text] = ids
                self._chars += len(text)
                while self._chars > self.max_chars:
                    evicted, _ = self._entries.popitem(last=False)
                    self._chars -= len(evicted)
        return list(ids)


_MEMOS: weakref.WeakKeyDictionary[Any, EncodingMemo] = weakref.WeakKeyDictionary()
_MEMOS_LOCK = threading.Lock()


def memo_of(tokenizer: Any) -> EncodingMemo:
    """``tokenizer``'s memo; a new one if its vocabulary changed (added tokens re-split texts)."""
    with _MEMOS_LOCK:
        memo = _MEMOS.get(tokenizer)
        if memo is None or memo.vocab_size != len(tokenizer):
            memo = _MEMOS[tokenizer] = EncodingMemo(tokenizer)
        return memo


def encode(tokenizer: Any, text: str) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=False)``, remembered."""
    try:
        memo = memo_of(tokenizer)
    except TypeError:  # a tokenizer that cannot be weakly referenced, hashed or measured: not remembered
        return tokenizer.encode(text, add_special_tokens=False)
    return memo.encode(text)
