"""BM25 product search (bm25s, Lucene variant, pyserini's parameters), one immutable index per catalogue shared
by all sessions. Documents are WebShop's indexed text.

Deviation: instead of Lucene's Porter stemmer, Lucene's English stop words and EnglishMinimalStemmer's plural
rules (numpy + bm25s only). Hits have a positive score, as Lucene returns only documents matching a term.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

if TYPE_CHECKING:
    from env_servers.envs.webshop.catalogue import Product

TOP_K = 50  # as WebShop
BM25_K1 = 0.9  # pyserini's defaults
BM25_B = 0.4
MAX_QUERY_CHARS = 1000  # bounds the work one reply can cause

_WORD_RE = re.compile(r"[a-z0-9]+")
_STOP = frozenset(STOPWORDS_EN)


def stem(word: str) -> str:
    """Lucene EnglishMinimalStemmer's plural rules: shoes -> shoe, berries -> berry."""
    n = len(word)
    if n < 3 or word[-1] != "s":
        return word
    if word[-2] in "us":
        return word
    if word[-2] == "e":
        if n > 3 and word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric runs, English stop words removed, plurals stemmed."""
    return [stem(w) for w in _WORD_RE.findall(text.lower()) if w not in _STOP]


def doc_text(product: Product) -> str:
    """WebShop's indexed text: ``lower(title + description + first bullet + options)``."""
    options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in product.options)
    first_bullet = product.bullets[0] if product.bullets else ""
    return " ".join((product.title, product.description, first_bullet, options)).lower()


class SearchIndex:
    """A bm25s index over ``products`` (in catalogue order); `search` returns catalogue indices, best first."""

    def __init__(self, products: Sequence[Product], k1: float = BM25_K1, b: float = BM25_B) -> None:
        self.size = len(products)
        self._retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        corpus = [tokenize(doc_text(p)) for p in products]
        self._retriever.index(corpus, show_progress=False)
        self._vocab = frozenset(self._retriever.vocab_dict)

    def search(self, query: str, k: int = TOP_K) -> tuple[int, ...]:
        """Indices of the (at most ``k``) best products with a positive score, best first."""
        words = [w for w in tokenize(query[:MAX_QUERY_CHARS]) if w in self._vocab]
        k = min(k, self.size)
        if not words or k < 1:
            return ()
        docs, scores = self._retriever.retrieve([words], k=k, show_progress=False, n_threads=0)
        docs, scores = docs[0], scores[0]
        # Ties by catalogue index: bm25s's top-k order is not stable.
        order = np.lexsort((docs, -scores))
        return tuple(int(docs[i]) for i in order if scores[i] > 0)
