"""The WebShop-lite text env: WebShop's text-mode pages (search, results, item, sub-page), ``search[...]`` /
``click[...]`` grammar (raw or inside ``<answer>`` tags) and rendering over our catalogue.

Deviations from WebShop: an invalid action scores the format penalty (WebShop: a silent no-op with reward 0; ROLL
adds the penalty); every observation ends with the available actions (as RAGEN/ROLL prompts); a selected option
shows as "<value> (selected)" (as WebShop's text_rich mode). A session holds only its page state; the catalogue
and index are shared.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env_servers.api import EnvSpec
from env_servers.envs.answer import extract_answer
from env_servers.envs.webshop import tools as webshop_tools
from env_servers.envs.webshop.catalogue import (
    DEFAULT_SEED,
    SPLITS,
    Catalogue,
    Goal,
    Product,
    get_catalogue,
)
from env_servers.envs.webshop.reward import RewardBreakdown, purchase_reward
from env_servers.envs.webshop.search import TOP_K
from env_servers.registry import register

METRICS = ("action_valid", "purchased", "success", "score")
RESULTS_PER_PAGE = 10
SEP = " [SEP] "
MAX_NUM_PRODUCTS = 100_000

BACK_TO_SEARCH = "back to search"
NEXT_PAGE = "next >"
PREV_PAGE = "< prev"
BUY_NOW = "buy now"
SUB_PAGES = ("description", "features", "reviews")
_ACTION_RE = re.compile(r"(search|click)\[(.*)\]", re.DOTALL)

SEARCH, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "sub", "done"
INTERFACES = ("text", "tools")


@dataclass(frozen=True)
class WebShopConfig:
    split: str = field(default="train", metadata={"doc": "goal split the reset seed draws from: train, dev or test"})
    max_steps: int = field(default=15, metadata={"doc": "replies before the episode is truncated (reward 0)"})
    format_penalty: float = field(
        default=-0.05, metadata={"doc": "reward of an invalid action (unparsable, or not available on the page)"}
    )
    num_products: int | None = field(
        default=None,
        metadata={"doc": "generated catalogue size (default 3000); with data_dir: keep the first N products"},
    )
    catalogue_seed: int = field(default=DEFAULT_SEED, metadata={"doc": "seed of the generated catalogue"})
    data_dir: str | None = field(
        default=None,
        metadata={
            "doc": "directory with the original WebShop files (items_shuffle.json, items_ins_v2.json, "
            "items_human_ins.json); None = the generated catalogue. Server-only: set it with "
            '`serve webshop --env-config \'webshop={"data_dir": "/path"}\'`, never from a client',
            "server_only": True,
        },
    )

    interface: str = field(
        default="text",
        metadata={"doc": "text: replies are search[...]/click[...] actions; tools: the search and click tools"},
    )
    max_calls_per_step: int = field(
        default=1, metadata={"doc": "tools interface: calls run per step, in order (the rest get an error result)"}
    )

    def __post_init__(self) -> None:
        if self.interface not in INTERFACES:
            raise ValueError(f"interface={self.interface!r} must be one of {', '.join(INTERFACES)}")
        if self.max_calls_per_step < 1:
            raise ValueError(f"max_calls_per_step={self.max_calls_per_step} must be >= 1")
        if self.split not in SPLITS:
            raise ValueError(f"split={self.split!r} must be one of {', '.join(SPLITS)}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty={self.format_penalty} must be <= 0")
        if self.num_products is not None and not 1 <= self.num_products <= MAX_NUM_PRODUCTS:
            raise ValueError(f"num_products={self.num_products} must be in [1, {MAX_NUM_PRODUCTS}]")
        if self.catalogue_seed < 0:
            raise ValueError(f"catalogue_seed={self.catalogue_seed} must be >= 0")


def parse_action(text: Any) -> tuple[str, str] | None:
    """``(kind, argument)`` of a reply, lower-cased and stripped; None if malformed."""
    if not isinstance(text, str):
        return None
    content = extract_answer(text)
    if content is None:
        content = text.lower()
    match = _ACTION_RE.fullmatch(content.strip())
    if match is None:
        return None
    return match.group(1), match.group(2).strip()


@register("webshop", WebShopConfig)
class WebShopEnv:
    """One WebShop session: find the product the instruction describes, pick its options and buy it."""

    def __init__(self, config: WebShopConfig, catalogue: Catalogue | None = None) -> None:
        self.config = config
        self.catalogue = catalogue or get_catalogue(config.num_products, config.catalogue_seed, config.data_dir)
        # Build the shared index now: the server's warm-up makes an env before SERVING.
        _ = self.catalogue.index
        self.goal: Goal | None = None
        self._goal_number = -1
        self._page = DONE
        self._query = ""
        self._hits: tuple[int, ...] = ()
        self._results_page = 0
        self._item = -1
        self._sub = ""
        self._chosen: dict[str, str] = {}
        self._last: RewardBreakdown | None = None
        self._steps = 0
        self._done = True  # step() before reset() is refused

    def fork(self) -> WebShopEnv:
        """A copy of this session that shares the read-only catalogue (and its search index) and copies the rest."""
        return copy.deepcopy(self, {id(self.catalogue): self.catalogue})

    # ---------------------------------------------------------------------------------------------- episode

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on a goal drawn by ``seed``, or ``options={"split": "test", "index": 17}``."""
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        options = options or {}
        split = options.get("split", self.config.split)
        if split not in SPLITS:
            raise ValueError(f"split={split!r} must be one of {', '.join(SPLITS)}")
        size = self.catalogue.split_size(split)
        if size == 0:
            raise ValueError(f"split '{split}' has no goals in this catalogue")
        if "index" in options:
            index = options["index"]
            if isinstance(index, float) and index.is_integer():
                index = int(index)
            if not isinstance(index, int) or isinstance(index, bool):
                raise ValueError(f"options.index must be an integer, got {index!r}")
        else:
            index = int(np.random.default_rng(seed).integers(size))
        self._goal_number, self.goal = self.catalogue.goal(split, index)
        self._page = SEARCH
        self._query, self._hits, self._results_page = "", (), 0
        self._item, self._sub, self._chosen = -1, "", {}
        self._last = None
        self._steps = 0
        self._done = False
        info = {
            "seed": seed,
            "split": split,
            "goal_index": index,
            "goal_number": self._goal_number,
            "instruction": self.goal.instruction,
        }
        return self._render(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.config.interface == "tools":
            return webshop_tools.tool_step(self, action)
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        self._steps += 1
        parsed = parse_action(action)
        valid = parsed is not None and self._apply(*parsed)
        return (self._render(), *self._outcome(valid))

    def _outcome(self, valid: bool) -> tuple[float, bool, bool, dict[str, Any]]:
        """Reward, terminated, truncated and info of the step just taken; an invalid step that bought (tools)
        still scores the format penalty."""
        reward = 0.0 if valid else self.config.format_penalty
        terminated = self._page == DONE
        if terminated and valid:
            reward = self._last.reward
        truncated = not terminated and self._steps >= self.config.max_steps
        self._done = terminated or truncated
        score = self._last.reward if terminated else 0.0
        success = terminated and abs(score - 1.0) < 1e-9
        info: dict[str, Any] = {
            "action_valid": valid,
            "page": self._page,
            "metrics": {
                "action_valid": float(valid),
                "purchased": float(terminated),
                "success": float(success),
                "score": score,
            },
        }
        if terminated:
            info["purchased_asin"] = self.catalogue.products[self._item].asin
            info["goal_asin"] = self.catalogue.products[self.goal.product].asin
            info["chosen_options"] = dict(self._chosen)
            info["reward_breakdown"] = self._last.as_dict()
        return reward, terminated, truncated, info

    # ---------------------------------------------------------------------------------------------- pages

    def clickables(self) -> list[str]:
        """The current page's click targets, in page order."""
        if self._page == RESULTS:
            out = [BACK_TO_SEARCH]
            if self._results_page > 0:
                out.append(PREV_PAGE)
            if self._results_page < self._num_pages() - 1:
                out.append(NEXT_PAGE)
            out += [self.catalogue.products[i].asin.lower() for i in self._page_hits()]
            return out
        if self._page == ITEM:
            product = self.catalogue.products[self._item]
            values = [v for _, vs in product.options for v in vs]
            return [BACK_TO_SEARCH, PREV_PAGE, *values, *SUB_PAGES, BUY_NOW]
        if self._page == SUB:
            return [BACK_TO_SEARCH, PREV_PAGE]
        return []

    def available_actions(self) -> dict[str, Any]:
        """WebShop's ``get_available_actions()``: whether there is a search bar, and the clickables."""
        return {"has_search_bar": self._page == SEARCH, "clickables": self.clickables()}

    def _apply(self, kind: str, arg: str) -> bool:
        """Perform a parsed action; False (nothing changes) when not available here."""
        if kind == "search":
            if self._page != SEARCH or not arg:
                return False
            self._query = arg
            self._hits = self.catalogue.index.search(arg, TOP_K)
            self._results_page = 0
            self._page = RESULTS
            return True
        if arg not in self.clickables():
            return False
        if arg == BACK_TO_SEARCH:
            self._page, self._query, self._hits, self._results_page = SEARCH, "", (), 0
        elif self._page == RESULTS:
            if arg == NEXT_PAGE:
                self._results_page += 1
            elif arg == PREV_PAGE:
                self._results_page -= 1
            else:
                self._item = self.catalogue.by_asin[arg]
                self._chosen = {}
                self._page = ITEM
        elif self._page == ITEM:
            if arg == PREV_PAGE:
                self._page = RESULTS
            elif arg in SUB_PAGES:
                self._sub, self._page = arg, SUB
            elif arg == BUY_NOW:
                self._buy()
            else:
                group = self.catalogue.products[self._item].option_values()[arg]
                self._chosen[group] = arg
        elif self._page == SUB and arg == PREV_PAGE:
            self._page = ITEM
        return True

    def _buy(self) -> None:
        target = self.catalogue.products[self.goal.product]
        bought = self.catalogue.products[self._item]
        self._last = purchase_reward(self.goal, target, bought, self._chosen, self.catalogue.nouns)
        self._page = DONE

    def _num_pages(self) -> int:
        return max(1, -(-len(self._hits) // RESULTS_PER_PAGE))

    def _page_hits(self) -> tuple[int, ...]:
        start = self._results_page * RESULTS_PER_PAGE
        return self._hits[start : start + RESULTS_PER_PAGE]

    def _render(self) -> str:
        parts = ["Instruction:", self.goal.instruction]
        products = self.catalogue.products
        if self._page == SEARCH:
            parts.append("Search")
        elif self._page == RESULTS:
            parts += [
                "Back to Search",
                f"Page {self._results_page + 1} (Total results: {len(self._hits)})",
            ]
            if self._results_page > 0:
                parts.append("< Prev")
            if self._results_page < self._num_pages() - 1:
                parts.append("Next >")
            for i in self._page_hits():
                parts += [products[i].asin, products[i].title, products[i].price_tag]
        elif self._page == ITEM:
            product = products[self._item]
            parts += ["Back to Search", "< Prev"]
            for name, values in product.options:
                parts.append(name)
                parts += [f"{v} (selected)" if self._chosen.get(name) == v else v for v in values]
            parts += [
                product.title,
                f"Price: {product.price_tag}",
                f"Rating: {product.rating}",
                "Description",
                "Features",
                "Reviews",
                "Buy Now",
            ]
        elif self._page == SUB:
            parts += ["Back to Search", "< Prev"] + self._sub_page(products[self._item])
        else:
            parts = self._done_page()
        text = SEP.join(p for p in parts if p)
        return f"{text}\nAvailable actions: {self._actions_text()}"

    def _sub_page(self, product: Product) -> list[str]:
        if self._sub == "description":
            return [product.description or "No description."]
        if self._sub == "features":
            return list(product.bullets) or ["No features."]
        reviews = [f"{score} stars{SEP}{title}{SEP}{body}" for score, title, body in product.reviews]
        return reviews or ["No reviews yet."]

    def _done_page(self) -> list[str]:
        bought = self.catalogue.products[self._item]
        chosen = ", ".join(f"{k}: {v}" for k, v in self._chosen.items()) or "none"
        return [
            "Thank you for shopping with us!",
            "Purchased",
            bought.asin,
            bought.title,
            f"Options: {chosen}",
            "Your score (min 0.0, max 1.0)",
            f"{self._last.reward:.4f}",
        ]

    def _actions_text(self) -> str:
        if self.config.interface == "tools":
            return webshop_tools.actions_text(self)
        if self._page == SEARCH:
            return "search[<query>]"
        if self._page == DONE:
            return "none (the episode is over)"
        return ", ".join(f"click[{c}]" for c in self.clickables())

    # ---------------------------------------------------------------------------------------------- spec

    @classmethod
    def describe(cls, config: WebShopConfig) -> EnvSpec:
        catalogue = get_catalogue(config.num_products, config.catalogue_seed, config.data_dir)
        instruction = (
            "You are shopping on WebShop, a text web store. Find the product that the instruction describes, "
            "select the requested options and buy it. Pages: search -> results (10 per page, up to 50) -> item "
            "(options, Description, Features, Reviews, Buy Now).\n"
            "Actions: search[your query] on the search page; click[element] for an element listed under "
            "'Available actions' (a product id, an option value, 'next >', '< prev', 'back to search', "
            "'description', 'features', 'reviews', 'buy now').\n"
            "Reward on Buy Now, between 0 and 1: the share of the requested attributes, options and price bound "
            "that the bought product meets, scaled down if it is the wrong kind of product. "
            f"An invalid action scores {config.format_penalty}; after {config.max_steps} actions without buying "
            "the episode ends with 0.\n"
            "Answer format: <answer>search[red running shoes]</answer> or <answer>click[buy now]</answer>."
        )
        spec = EnvSpec(
            env_id="webshop",
            version="1",
            instruction=instruction,
            action_format="<answer>search[query]</answer> or <answer>click[element]</answer> (tags optional)",
            example_action="<answer>search[red running shoes]</answer>",
            max_steps=config.max_steps,
            reward_min=min(0.0, config.format_penalty),
            reward_max=1.0,
            deterministic=True,
            splits={name: catalogue.split_size(name) for name in SPLITS},
            metrics=METRICS,
        )
        return webshop_tools.tool_spec(spec, config) if config.interface == "tools" else spec
