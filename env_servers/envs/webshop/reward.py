"""WebShop's purchase reward, paid on Buy Now (other steps earn 0); success is R == 1.

    R = r_type * (A + O + P) / (|goal attributes| + |goal options| + 1)

A: goal attributes the product has (fuzzy-matches an attribute, else a substring of title, bullets or
description); O: goal option values fuzzy-matched by a chosen value (colours normalised); P: price <= price_upper;
r_type: `type_reward`. Fuzzy is ``token_set_ratio > 85`` with ``default_process``, as WebShop's ``thefuzz``
call; its quirk is kept: a word subset scores 100 ("x-large" matches "large", "7.5" matches "7").

Deviation: nouns come from ``Catalogue.nouns`` instead of spaCy POS tags (not available offline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

from env_servers.envs.webshop.catalogue import Goal, Product

FUZZY_THRESHOLD = 85
# Longest first so "navy blue" wins over "blue".
COLORS = tuple(
    sorted(
        (
            "black", "white", "grey", "gray", "navy blue", "navy", "blue", "red", "pink", "beige", "brown", "green",
            "purple", "yellow", "orange", "gold", "rose gold", "silver", "sky blue", "khaki", "ivory", "multicolor",
        ),
        key=lambda c: (-len(c), c),
    )
)  # fmt: skip


@dataclass(frozen=True)
class RewardBreakdown:
    reward: float
    r_type: float
    title_score: float
    query_match: bool
    category_match: bool
    attr_matches: int
    option_matches: int
    price_ok: bool
    num_attributes: int
    num_options: int

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def similar(a: str, b: str) -> bool:
    return fuzz.token_set_ratio(a, b, processor=default_process) > FUZZY_THRESHOLD


def normalize_color(value: str) -> str:
    """The first known colour named in ``value``, else ``value``."""
    lowered = value.lower()
    return next((c for c in COLORS if c in lowered), value)


def title_score(goal_nouns: set[str], bought_nouns: set[str]) -> float:
    if not goal_nouns:
        return 0.2
    return len(goal_nouns & bought_nouns) / len(goal_nouns)


def type_reward(target: Product, bought: Product, nouns: Callable[[str], set[str]]) -> tuple[float, float, bool, bool]:
    """(r_type, title_score, query_match, category_match) of buying ``bought`` when ``target`` was wanted.

    r_type is 1, or 0.5 when none of: same search query, >= 2 shared category segments, title_score > 0.2; then
    0.1 if title_score < 0.1, 0 if it is 0. title_score: the share of the target title's nouns in the bought one's.
    """
    query_match = bool(target.query) and target.query == bought.query
    target_path = {s.strip() for s in target.product_category.split("›") if s.strip()}
    bought_path = {s.strip() for s in bought.product_category.split("›") if s.strip()}
    category_match = len(target_path & bought_path) >= 2
    score = title_score(nouns(target.title), nouns(bought.title))
    r_type = 1.0
    if not (query_match or category_match or score > 0.2):
        r_type = 0.5
    if score < 0.1:
        r_type = 0.1
    if score == 0.0:
        r_type = 0.0
    return r_type, score, query_match, category_match


def attribute_matches(goal_attributes: Iterable[str], product: Product) -> int:
    text_fields = (product.title.lower(), " ".join(product.bullets).lower(), product.description.lower())
    count = 0
    for g in goal_attributes:
        if any(similar(p, g) for p in product.attributes) or any(g.lower() in t for t in text_fields):
            count += 1
    return count


def option_matches(goal_values: Iterable[str], chosen_values: Iterable[str]) -> int:
    chosen = [normalize_color(c) for c in chosen_values]
    return sum(1 for g in goal_values if any(similar(c, normalize_color(g)) for c in chosen))


def purchase_reward(
    goal: Goal,
    target: Product,
    bought: Product,
    chosen: Mapping[str, str],
    nouns: Callable[[str], set[str]],
) -> RewardBreakdown:
    """The reward of buying ``bought`` with options ``chosen`` (group -> value) for ``goal``."""
    r_type, score, query_match, category_match = type_reward(target, bought, nouns)
    attrs = attribute_matches(goal.attributes, bought)
    opts = option_matches([value for _, value in goal.options], chosen.values())
    price_ok = bought.price <= goal.price_upper
    denominator = len(goal.attributes) + len(goal.options) + 1
    reward = r_type * (attrs + opts + int(price_ok)) / denominator
    return RewardBreakdown(
        reward=reward,
        r_type=r_type,
        title_score=score,
        query_match=query_match,
        category_match=category_match,
        attr_matches=attrs,
        option_matches=opts,
        price_ok=price_ok,
        num_attributes=len(goal.attributes),
        num_options=len(goal.options),
    )
