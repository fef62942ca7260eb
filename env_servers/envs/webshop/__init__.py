"""WebShop-lite: WebShop's pages, actions and purchase reward over a generated (or the original) catalogue.

Importing this package registers the env id ``webshop``. Modules:
- `catalogue`: products, goals, splits and the per-process store (`get_catalogue`);
- `generated`: the default, deterministic catalogue; `original`: the loader for princeton-nlp/WebShop's files;
- `search`: the shared bm25s index; `reward`: the purchase reward; `env`: pages, actions, rendering, `WebShopEnv`.
- `tools`: the tools interface (``interface: "tools"``): ``search(query)`` and ``click(target)`` as tool calls.

Serve it with ``python -m env_servers serve webshop``. To use the original data files the operator adds
``--env-config 'webshop={"data_dir": "/path/to/webshop/data"}'`` (clients cannot set ``data_dir``).
"""

from env_servers.envs.webshop.catalogue import Catalogue, Goal, Product, get_catalogue
from env_servers.envs.webshop.env import METRICS, WebShopConfig, WebShopEnv, parse_action
from env_servers.envs.webshop.generated import default_catalogue, generate_catalogue
from env_servers.envs.webshop.original import load_webshop_data
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
