"""Built-in environments; importing this package registers them."""

from env_servers.envs import frozenlake, sokoban, webshop  # noqa: F401
