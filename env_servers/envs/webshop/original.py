"""The loader for princeton-nlp/WebShop's original data files (the operator's ``data_dir``)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from env_servers.envs.webshop.catalogue import (
    GOAL_SHUFFLE_SEED,
    MISSING_PRICE,
    Catalogue,
    Goal,
    Product,
    option_text,
    price_text,
    price_upper_for,
)

PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_GOAL_FILES = ("items_human_ins.json",)
_PRICE_RE = re.compile(r"\$\s*([0-9][0-9,]*(?:\.[0-9]+)?)")


def _first_file(data_dir: Path, names: Sequence[str]) -> Path | None:
    return next((data_dir / n for n in names if (data_dir / n).is_file()), None)


def _asin_rng(asin: str, purpose: str) -> random.Random:
    """A per-product RNG, so the data is deterministic whatever the file order."""
    return random.Random(f"webshop-data/{purpose}/{asin}")


def parse_pricing(pricing: Any, asin: str) -> tuple[float, str]:
    """(price, tag) from WebShop's ``pricing``; a range's price is drawn inside it per ASIN, none gives $100."""
    if isinstance(pricing, int | float) and not isinstance(pricing, bool):
        values = [float(pricing)]
    elif isinstance(pricing, list):
        values = [float(v) for v in pricing if isinstance(v, int | float) and not isinstance(v, bool)]
    elif isinstance(pricing, str):
        values = [float(v.replace(",", "")) for v in _PRICE_RE.findall(pricing)]
    else:
        values = []
    if not values:
        return MISSING_PRICE, f"${MISSING_PRICE:.2f}"
    if len(values) == 1 or values[1] <= values[0]:
        return values[0], f"${values[0]:.2f}"
    lo, hi = values[0], values[1]
    return round(_asin_rng(asin, "price").uniform(lo, hi), 2), f"${lo:.2f} to ${hi:.2f}"


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(_as_text(v) for v in value)
    return str(value).strip()


def _as_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(line.strip() for line in value.split("\n") if line.strip())
    if isinstance(value, list):
        return tuple(_as_text(v) for v in value if _as_text(v))
    return (str(value),)


def _parse_options(raw: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``customization_options`` -> lower-case groups, like WebShop."""
    if not isinstance(raw, Mapping):
        return ()
    groups, used = [], set()
    for name, contents in raw.items():
        values = []
        for item in contents or ():
            value = item.get("value") if isinstance(item, Mapping) else item
            value = _as_text(value).replace("/", " | ").lower()
            if value and value not in used:
                used.add(value)
                values.append(value)
        if values:
            groups.append((str(name).lower(), tuple(values)))
    return tuple(groups)


def _parse_product(raw: Mapping[str, Any], attrs: Mapping[str, Any]) -> Product | None:
    asin = _as_text(raw.get("asin"))
    title = _as_text(raw.get("name") or raw.get("Title"))
    if not asin or not title:
        return None
    price, tag = parse_pricing(raw.get("pricing", raw.get("Price")), asin)
    rating = raw.get("average_rating", raw.get("Rating"))
    reviews = []
    for r in raw.get("Reviews") or raw.get("reviews") or ():
        if isinstance(r, Mapping):
            reviews.append((_as_text(r.get("score")), _as_text(r.get("title")), _as_text(r.get("body"))))
    info = attrs.get(asin) or {}
    attributes = info.get("attributes") if isinstance(info, Mapping) else None
    return Product(
        asin=asin,
        title=title,
        category=_as_text(raw.get("category")),
        product_category=_as_text(raw.get("product_category")),
        query=_as_text(raw.get("query")).lower(),
        bullets=_as_list(raw.get("small_description", raw.get("BulletPoints"))),
        description=_as_text(raw.get("full_description", raw.get("Description"))),
        attributes=_as_list(attributes if attributes is not None else raw.get("Attributes")),
        options=_parse_options(raw.get("customization_options")),
        price=price,
        price_tag=tag,
        rating=_as_text(rating) or "N.A.",
        reviews=tuple(reviews),
        product_type="",
    )


def _goal_options(product: Product, values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    owner = product.option_values()
    out = []
    for value in values:
        v = _as_text(value).lower()
        if v:
            out.append((owner.get(v, ""), v))
    return tuple(out)


def load_webshop_data(data_dir: str | os.PathLike[str], num_products: int | None = None) -> Catalogue:
    """A catalogue from WebShop's ``items_shuffle[_1000].json``, optional ``items_ins_v2[_1000].json`` (attributes,
    synthetic goals) and optional ``items_human_ins.json`` (the human goals, used instead when present).

    ``num_products`` keeps the first N. Deviation: goals are shuffled by our own seeded RNG, so their order differs
    from the original's. The file is loaded whole: meant for the 1k file or a subset.
    """
    root = Path(data_dir)
    product_file = _first_file(root, PRODUCT_FILES)
    if product_file is None:
        raise FileNotFoundError(f"{root}: none of {', '.join(PRODUCT_FILES)} found")
    raw_products = json.loads(product_file.read_text(encoding="utf-8"))
    if not isinstance(raw_products, list):
        raise ValueError(f"{product_file}: expected a JSON list of products")
    attr_file = _first_file(root, ATTRIBUTE_FILES)
    attrs = json.loads(attr_file.read_text(encoding="utf-8")) if attr_file else {}
    human_file = _first_file(root, HUMAN_GOAL_FILES)

    products: list[Product] = []
    seen: set[str] = set()
    for raw in raw_products:
        if num_products is not None and len(products) >= num_products:
            break
        product = _parse_product(raw, attrs) if isinstance(raw, Mapping) else None
        if product is not None and product.asin.lower() not in seen:
            seen.add(product.asin.lower())
            products.append(product)
    index = {p.asin: i for i, p in enumerate(products)}

    goals: list[Goal] = []
    if human_file is not None:
        human = json.loads(human_file.read_text(encoding="utf-8"))
        for asin, entries in human.items():
            if asin not in index:
                continue
            product = products[index[asin]]
            upper = price_upper_for(product.price, _asin_rng(asin, "upper"))
            for entry in entries or ():
                text = _as_text(entry.get("instruction")).rstrip(".").strip()
                if not text:
                    continue
                goal_attrs = _as_list(entry.get("instruction_attributes"))
                opts = _goal_options(product, entry.get("instruction_options") or ())
                goals.append(Goal(index[asin], text + price_text(upper), goal_attrs, opts, upper))
    else:
        for i, product in enumerate(products):
            info = attrs.get(product.asin) or {}
            text = _as_text(info.get("instruction")).rstrip(".").strip()
            goal_attrs = _as_list(info.get("instruction_attributes"))
            if not text or not goal_attrs:
                continue
            rng = _asin_rng(product.asin, "upper")
            upper = price_upper_for(product.price, rng)
            names = sorted(name for name, _ in product.options)
            groups = dict(product.options)
            for combo in itertools.product(*(groups[n] for n in names)):
                opts = tuple(zip(names, combo, strict=True))
                goals.append(Goal(i, text + option_text(opts) + price_text(upper), goal_attrs, opts, upper))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalogue(products, goals, noun_lexicon=None, source=f"data:{root}")


@functools.lru_cache(maxsize=2)
def cached_data_dir(data_dir: str, num_products: int | None = None) -> Catalogue:
    """`load_webshop_data`, once per process and argument pair."""
    return load_webshop_data(data_dir, num_products)
