"""The trainer-side env client: `EnvPool` over many env servers, `EnvSession` per episode runner.

No torch here: the client is usable from any asyncio program (and from `python -m roll_lightning.envs play`).
"""

from roll_lightning.envs.client import EnvClient
from roll_lightning.envs.errors import (
    EchoMismatch,
    EnvOutage,
    EpisodeFailed,
    EpisodesKeepFailing,
    NoEndpointAvailable,
)
from roll_lightning.envs.pool import EnvPool
from roll_lightning.envs.session import EnvSession, ResetOutcome, StepOutcome

__all__ = [
    "EchoMismatch",
    "EnvClient",
    "EnvOutage",
    "EpisodesKeepFailing",
    "EnvPool",
    "EnvSession",
    "EpisodeFailed",
    "NoEndpointAvailable",
    "ResetOutcome",
    "StepOutcome",
]
