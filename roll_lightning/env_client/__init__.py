"""The trainer-side env client: `EnvPool` over many env servers, `EnvSession` per episode runner.

No torch here: the client is usable from any asyncio program.
"""

from roll_lightning.env_client.client import EnvClient
from roll_lightning.env_client.errors import (
    EchoMismatch,
    EnvOutage,
    EpisodeFailed,
    EpisodesKeepFailing,
    NoEndpointAvailable,
    ProtocolViolation,
    StartTimedOut,
)
from roll_lightning.env_client.pool import EnvPool
from roll_lightning.env_client.session import EnvSession, ObservationImage, ResetOutcome, StepOutcome
from roll_lightning.env_client.tools import ClientTool, ClientToolCall, ClientToolResult, tools_of

__all__ = [
    "ClientTool",
    "ClientToolCall",
    "ClientToolResult",
    "EchoMismatch",
    "EnvClient",
    "EnvOutage",
    "EpisodesKeepFailing",
    "EnvPool",
    "EnvSession",
    "EpisodeFailed",
    "NoEndpointAvailable",
    "ObservationImage",
    "ProtocolViolation",
    "ResetOutcome",
    "StartTimedOut",
    "StepOutcome",
    "tools_of",
]
