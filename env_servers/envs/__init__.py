"""Built-in environments; importing this package registers them."""

from env_servers.envs import calculator, frozenlake, lookup, sokoban, webshop  # noqa: F401
