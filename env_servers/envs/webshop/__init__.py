"""WebShop-lite: WebShop's pages, actions and purchase reward over a generated (or the original) catalogue.

Importing it registers ``webshop``. The original data: ``python -m env_servers serve webshop --env-config
'webshop={"data_dir": "/path/to/webshop/data"}'`` (operator-only; clients cannot set ``data_dir``).
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
