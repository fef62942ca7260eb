"""WebShop-lite: WebShop's pages, actions and purchase reward over a generated (or the original) catalogue.

Importing this package registers the env id ``webshop``. Modules: `catalogue` (products, goals, splits, the
original-data loader), `search` (the shared bm25s index), `reward` (the purchase reward), `env` (pages, actions,
rendering, `WebShopEnv`). Serve it with ``python -m env_servers serve webshop``; a session may pass
``{"data_dir": "/path/to/webshop/data"}`` in its CreateSession config to use the original data files.
"""

from env_servers.envs.webshop.catalogue import (
    Catalogue,
    Goal,
    Product,
    default_catalogue,
    generate_catalogue,
    get_catalogue,
    load_webshop_data,
)
from env_servers.envs.webshop.env import METRICS, WebShopConfig, WebShopEnv, parse_action
from env_servers.envs.webshop.reward import RewardBreakdown, purchase_reward
from env_servers.envs.webshop.search import SearchIndex

__all__ = [
    "METRICS",
    "Catalogue",
    "Goal",
    "Product",
    "RewardBreakdown",
    "SearchIndex",
    "WebShopConfig",
    "WebShopEnv",
    "default_catalogue",
    "generate_catalogue",
    "get_catalogue",
    "load_webshop_data",
    "parse_action",
    "purchase_reward",
]
