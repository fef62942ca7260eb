"""WebShop's actions as tools (``interface: "tools"``): ``search(query)`` is ``search[query]`` and
``click(target)`` is ``click[target]``, with the same pages and reward; each call's result says what it did.

A call not available on the page, past ``max_calls_per_step``, or malformed makes the step invalid (the format
penalty, even if another call bought); calls after a purchase are not run but are not invalid.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from env_servers.api import Action, EnvSpec, Observation, Tool, ToolCall, ToolResult
from env_servers.envs.webshop import env as shop

if TYPE_CHECKING:
    from env_servers.envs.webshop.env import WebShopConfig, WebShopEnv

TOOLS = (
    Tool(
        "search",
        "Search the store for products (only on the search page); shows the first results page.",
        {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "e.g. red running shoes under 50 dollars"}},
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    Tool(
        "click",
        "Click an element of the current page: a product id, an option value, 'next >', '< prev', "
        "'back to search', 'description', 'features', 'reviews' or 'buy now'.",
        {
            "type": "object",
            "properties": {"target": {"type": "string", "description": "one of the page's available click targets"}},
            "required": ["target"],
            "additionalProperties": False,
        },
    ),
)
_ARGUMENT = {"search": "query", "click": "target"}


def tool_spec(spec: EnvSpec, config: WebShopConfig) -> EnvSpec:
    """The text mode's spec with the tools and describing calls."""
    limit = config.max_calls_per_step
    per_step = "one tool call per reply" if limit == 1 else f"up to {limit} tool calls per reply, run in order"
    instruction = (
        "You are shopping on WebShop, a text web store. Find the product that the instruction describes, "
        "select the requested options and buy it. Pages: search -> results (10 per page, up to 50) -> item "
        "(options, Description, Features, Reviews, Buy Now).\n"
        "Act only through tool calls: search(query) on the search page; click(target) for a target listed under "
        "'Available actions' (a product id, an option value, 'next >', '< prev', 'back to search', "
        f"'description', 'features', 'reviews', 'buy now'). Make {per_step}; each call's result says what it did "
        "and the new page is shown after it.\n"
        "Reward on Buy Now, between 0 and 1: the share of the requested attributes, options and price bound "
        "that the bought product meets, scaled down if it is the wrong kind of product. "
        f"A reply without a call, or a call not available on the page, scores {config.format_penalty}; after "
        f"{config.max_steps} replies without buying the episode ends with 0."
    )
    return dataclasses.replace(
        spec,
        instruction=instruction,
        action_format=f"{per_step}: search(query) or click(target)",
        example_action='search({"query": "red running shoes"})',
        metrics=(*spec.metrics, "tool_calls"),
        tools=TOOLS,
    )


def actions_text(env: WebShopEnv) -> str:
    """The observation's last line: the available actions as calls."""
    if env._page == shop.SEARCH:
        return "search(query)"
    if env._page == shop.DONE:
        return "none (the episode is over)"
    return f"click(target) with target one of {json.dumps(env.clickables())}"


def tool_step(env: WebShopEnv, action: Action | str) -> tuple[Observation, float, bool, bool, dict[str, Any]]:
    if env._done:
        raise RuntimeError("step() called on a finished episode; call reset() first")
    action = Action(action) if isinstance(action, str) else action
    env._steps += 1
    limit = env.config.max_calls_per_step
    valid = bool(action.tool_calls)
    results = []
    for i, call in enumerate(action.tool_calls):
        if i >= limit:
            results.append(ToolResult(call.id, call.name, f"not run: at most {limit} call(s) per step", True))
            valid = False
        elif env._page == shop.DONE:
            results.append(ToolResult(call.id, call.name, "not run: the purchase ended the episode", True))
        else:
            ok, content = _run(env, call)
            results.append(ToolResult(call.id, call.name, content, not ok))
            valid = valid and ok
    reward, terminated, truncated, info = env._outcome(valid)
    info["metrics"]["tool_calls"] = float(len(results))
    return Observation(env._render(), tool_results=tuple(results)), reward, terminated, truncated, info


def _run(env: WebShopEnv, call: ToolCall) -> tuple[bool, str]:
    """Perform one call: (valid, what it did or why not). Never raises."""
    if call.name not in _ARGUMENT:
        return False, f"unknown tool '{call.name}' (tools: search, click)"
    key = _ARGUMENT[call.name]
    try:  # the runtime checked these; unit tests call directly
        arguments = json.loads(call.arguments)
        value = arguments[key]
        if not isinstance(value, str):
            raise TypeError(f"'{key}' must be a string")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return False, f"error: the arguments must be a JSON object with a string '{key}' ({exc!r})"
    arg = value.lower().strip()
    page, item, chosen = env._page, env._item, dict(env._chosen)
    if not env._apply(call.name, arg):
        return False, _why_not(env, call.name, arg)
    if call.name == "search":
        return True, f"searched for '{arg}': {len(env._hits)} results, page 1 of {env._num_pages()}"
    return True, _clicked(env, arg, page, item, chosen)


def _why_not(env: WebShopEnv, kind: str, arg: str) -> str:
    here = f"this is the {env._page} page; available: {actions_text(env)}"
    if kind == "search":
        return f"error: the query is empty ({here})" if env._page == shop.SEARCH else f"error: cannot search ({here})"
    return f"error: '{arg}' is not clickable ({here})"


def _clicked(env: WebShopEnv, arg: str, page: str, item: int, chosen: dict[str, str]) -> str:
    """What a valid click did, given the state before it."""
    products = env.catalogue.products
    if arg == shop.BACK_TO_SEARCH:
        return "back on the search page"
    if env._page == shop.DONE:
        return f"bought {products[env._item].asin} (score {env._last.reward:.4f})"
    if page == shop.RESULTS and env._page == shop.RESULTS:
        return f"went to results page {env._results_page + 1} of {env._num_pages()}"
    if page == shop.RESULTS:
        return f"opened {products[env._item].asin} ({products[env._item].title})"
    if env._page == shop.RESULTS:
        return f"back on results page {env._results_page + 1}"
    if env._page == shop.SUB:
        return f"opened {env._sub}"
    if page == shop.SUB:
        return f"back on {products[item].asin}"
    group = products[env._item].option_values()[arg]
    return f"selected '{arg}' for {group}" + (f" (was '{chosen[group]}')" if group in chosen else "")
