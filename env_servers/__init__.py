"""Text environments served over the roll_lightning env protocol (gRPC); no torch needed.

`python -m env_servers serve sokoban frozenlake --port 50051`.
"""

from env_servers.api import IMAGE_MARKER, ConfigError, EnvSpec, Image, Observation, TextEnv
from env_servers.registry import get_env, known_env_ids, register

__all__ = [
    "IMAGE_MARKER",
    "ConfigError",
    "EnvSpec",
    "Image",
    "Observation",
    "TextEnv",
    "get_env",
    "known_env_ids",
    "register",
]
