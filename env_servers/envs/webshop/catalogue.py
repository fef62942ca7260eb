"""WebShop-lite products, goals and splits, and the per-process catalogue store.

A `Catalogue` (generated, or princeton-nlp/WebShop's files via ``data_dir``) is read-only and cached per process,
so all sessions share it and its search index. Splits as the original: goals 0-499 test, 500-1499 dev, 1500+ train.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATALOGUE_VERSION = "1"
DEFAULT_NUM_PRODUCTS = 3000
DEFAULT_SEED = 0
GOAL_SHUFFLE_SEED = 233  # WebShop's random.seed(233)
GOALS_PER_PRODUCT = 4
NO_PRICE_BOUND = 1_000_000.0
MISSING_PRICE = 100.0  # WebShop's price for products without one
PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # WebShop's PRICE_RANGE
SPLIT_BOUNDS = {"test": (0, 500), "dev": (500, 1500), "train": (1500, None)}
SPLITS = tuple(SPLIT_BOUNDS)

_TOKEN_RE = re.compile(r"[a-z0-9]+")
# Dropped by the noun fallback for the original data.
_FUNCTION_WORDS = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on or our such that the their then there "
    "these they this to was will with you your all any can each few more most other some than too very up down out "
    "over under new best set pack count inch inches ft oz fl ounce ounces pound lb".split()
)


@dataclass(frozen=True, slots=True)
class Product:
    """One product. Option values are lower-case and unique per product."""

    asin: str
    title: str
    category: str
    product_category: str  # "Dept › Sub › Leaf"
    query: str
    bullets: tuple[str, ...]
    description: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (group name, values), both lower-case
    price: float  # compared with price_upper; fixed inside the range for ranged tags
    price_tag: str  # "$12.99" or "$12.99 to $19.99"
    rating: str = "N.A."
    reviews: tuple[tuple[str, str, str], ...] = ()  # (score, title, body)
    brand: str = ""
    product_type: str = ""

    def option_values(self) -> dict[str, str]:
        """Option value -> its group name (the first group wins)."""
        out: dict[str, str] = {}
        for name, values in self.options:
            for value in values:
                out.setdefault(value, name)
        return out


@dataclass(frozen=True, slots=True)
class Goal:
    """A shopping instruction and what the reward checks."""

    product: int  # index into Catalogue.products
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, str], ...]  # (group name or "", value)
    price_upper: float = NO_PRICE_BOUND


def tokens(text: str) -> list[str]:
    """Lower-case alphanumeric runs."""
    return _TOKEN_RE.findall(text.lower())


class Catalogue:
    """Products, goals (in split order) and the reward's noun lexicon; read-only once built."""

    def __init__(
        self,
        products: Sequence[Product],
        goals: Sequence[Goal],
        *,
        noun_lexicon: Iterable[str] | None = None,
        source: str = "custom",
    ) -> None:
        self.products: tuple[Product, ...] = tuple(products)
        self.goals: tuple[Goal, ...] = tuple(goals)
        self.source = source
        self.noun_lexicon: frozenset[str] | None = None if noun_lexicon is None else frozenset(noun_lexicon)
        self.by_asin: dict[str, int] = {}
        for i, product in enumerate(self.products):
            if product.asin.lower() in self.by_asin:
                raise ValueError(f"duplicate asin {product.asin}")
            self.by_asin[product.asin.lower()] = i
        for goal in self.goals:
            if not 0 <= goal.product < len(self.products):
                raise ValueError(f"goal refers to product {goal.product}, catalogue has {len(self.products)}")
        n = len(self.goals)
        self.splits: dict[str, range] = {
            name: range(min(lo, n), n if hi is None else min(hi, n)) for name, (lo, hi) in SPLIT_BOUNDS.items()
        }
        self._index: Any = None
        self._index_lock = threading.Lock()

    def split_size(self, split: str) -> int:
        return len(self.splits[split])

    def goal(self, split: str, index: int) -> tuple[int, Goal]:
        """(global goal number, goal) of the ``index``-th goal of ``split``."""
        rng = self.splits[split]
        if not 0 <= index < len(rng):
            raise IndexError(f"goal index {index} out of range for split '{split}' ({len(rng)} goals)")
        return rng[index], self.goals[rng[index]]

    def nouns(self, text: str) -> set[str]:
        """The title score's nouns (deviation: spaCy POS tags in WebShop): words in the lexicon (product types,
        brands, audiences) or, without one (original data), words that are not function words or numbers."""
        words = tokens(text)
        if self.noun_lexicon is not None:
            return {w for w in words if w in self.noun_lexicon}
        return {w for w in words if w not in _FUNCTION_WORDS and not w.isdigit() and len(w) > 1}

    @property
    def index(self) -> Any:
        """The `search.SearchIndex`, built once on first use."""
        if self._index is None:
            with self._index_lock:
                if self._index is None:
                    from env_servers.envs.webshop.search import SearchIndex

                    self._index = SearchIndex(self.products)
        return self._index


# --------------------------------------------------------------------------------------------------------------
# Goal text and price bounds


def price_upper_for(price: float, rng: random.Random) -> float:
    """WebShop's bound: the larger of two draws from the next four $10 steps above ``price`` (else no bound)."""
    candidates = [p for p in PRICE_STEPS if p > price][:4]
    if len(candidates) < 2:
        return NO_PRICE_BOUND
    return max(rng.sample(candidates, 2))


def price_text(price_upper: float) -> str:
    return "" if price_upper >= NO_PRICE_BOUND else f", and price lower than {price_upper:.2f} dollars"


def option_text(options: Sequence[tuple[str, str]]) -> str:
    parts = [f"{name}: {value}" if name else value for name, value in options]
    return " with " + ", and ".join(parts) if parts else ""


def catalogue_fingerprint(catalogue: Catalogue) -> str:
    """sha256 over products and goals: pins the generator output for tests."""
    h = hashlib.sha256()
    for p in catalogue.products:
        h.update(repr((p.asin, p.title, p.product_category, p.attributes, p.options, p.price, p.price_tag)).encode())
    for g in catalogue.goals:
        h.update(repr((g.product, g.instruction, g.attributes, g.options, g.price_upper)).encode())
    return h.hexdigest()


_BUILD_LOCK = threading.Lock()


def get_catalogue(num_products: int | None, seed: int, data_dir: str | None) -> Catalogue:
    """The shared catalogue for a config, built once under a lock."""
    from env_servers.envs.webshop.generated import default_catalogue
    from env_servers.envs.webshop.original import cached_data_dir

    with _BUILD_LOCK:
        if data_dir:
            return cached_data_dir(str(Path(data_dir).resolve()), num_products)
        return default_catalogue(DEFAULT_NUM_PRODUCTS if num_products is None else num_products, seed)
