"""The remembered encoding of prompt texts gives the tokenizer's own ids, stays bounded, and forgets a tokenizer
whose vocabulary changed."""

from __future__ import annotations

import random
from typing import Any

from transformers import AutoTokenizer

from roll_lightning.models.resolve import resolve_model
from roll_lightning.rollout.prompts.encoding import EncodingMemo, encode, memo_of


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    cells = "#_PXO√ "
    boards = ["\n".join("".join(rng.choice(cells) for _ in range(4)) for _ in range(4)) for _ in range(n)]
    return [
        f"<|im_start|>user\nTurn {k % 7 + 1}:\n{b}<|im_end|>\n<|im_start|>assistant\n" for k, b in enumerate(boards)
    ]


def test_remembered_ids_are_the_tokenizers_own_on_a_bpe_and_a_word_vocabulary(tokenizer: Any) -> None:
    grid = AutoTokenizer.from_pretrained(resolve_model("tiny-grid"))
    for tok in (tokenizer, grid):
        texts = _texts(60)
        for text in texts * 3:  # the second and third passes are answered from the memo
            assert encode(tok, text) == tok.encode(text, add_special_tokens=False)
        assert memo_of(tok).hits >= 120


def test_each_answer_is_a_fresh_list_the_caller_may_extend(tokenizer: Any) -> None:
    text = "Turn 1:\n#P_O#"
    first = encode(tokenizer, text)
    first.append(-1)
    assert encode(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False)


def test_the_memo_holds_at_most_its_budget_of_text_least_recently_used_out_first(tokenizer: Any) -> None:
    texts = _texts(40, seed=1)
    budget = sum(len(t) for t in texts[:10])
    memo = EncodingMemo(tokenizer, max_chars=budget)
    for text in texts:
        memo.encode(text)
    assert memo._chars <= budget
    kept = list(memo._entries)
    assert kept == [t for t in texts if t in memo._entries] and texts[-1] in kept and texts[0] not in kept
    assert memo.encode(texts[-1]) == tokenizer.encode(texts[-1], add_special_tokens=False)


def test_a_tokenizer_given_new_tokens_is_encoded_afresh(model_dir: Any) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "play the move zqxjkv now"
    before = encode(tok, text)
    tok.add_tokens(["zqxjkv"])
    after = encode(tok, text)
    assert after == tok.encode(text, add_special_tokens=False) != before
    assert tok.convert_tokens_to_ids("zqxjkv") in after
