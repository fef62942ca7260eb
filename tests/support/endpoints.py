"""`serving`: the agent endpoint on the tiny model's real transformers engine, on the test's loop, for as long as
the block runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from roll_lightning.rollout.agents.endpoint import AgentEndpoint, EndpointConfig
from roll_lightning.rollout.engines.transformers_engine import TransformersEngine


@contextlib.asynccontextmanager
async def serving(model_dir: Path, tokenizer: Any, config: EndpointConfig) -> AsyncIterator[AgentEndpoint]:
    engine = TransformersEngine(model_dir, seed=0)
    served = AgentEndpoint(engine, tokenizer, config)
    await served.start()
    try:
        yield served
    finally:
        await served.stop()
        await engine.close()
