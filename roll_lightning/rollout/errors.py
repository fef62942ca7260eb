"""The rollout's configuration error, below every room so each can raise it."""

from roll_lightning.settings import ConfigError


class RolloutConfigError(ConfigError):
    """A rollout setting that cannot work; the message names the key."""
