"""Text environments served over the roll_lightning env protocol (gRPC).

Installable and runnable without torch, transformers or vLLM: env hosts are small machines.
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
