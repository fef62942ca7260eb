"""`EnvServers`: a run's env pools, one per set of endpoints, checked before a model is loaded: `start` raises
one `RolloutConfigError` naming the key for anything that cannot work.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from roll_lightning.env_client import EnvPool, EpisodeFailed, NoEndpointAvailable, StartTimedOut
from roll_lightning.env_client.errors import EndpointRefused, EndpointTlsMismatch
from roll_lightning.rollout.config.envs import LaneSpec, RolloutConfigError
from roll_lightning.rollout.config.rollout import EnvsConfig
from roll_lightning.rollout.episodes.episode import ContextBudgetError, Episode, EpisodeBuilder, ToolHistoryError
from roll_lightning.rollout.prompts.vision import ImageEncoder, ImageInputError

Endpoints = str | tuple[str, ...]


class EnvServers:
    def __init__(self, envs: EnvsConfig, lanes: list[LaneSpec]) -> None:
        """``lanes``: every env the run plays, training and evaluation."""
        self.envs, self.lanes = envs, [lane for lane in lanes if lane.agent is None]  # agent lanes need no server
        self._env_ids: dict[Endpoints, list[str]] = {}
        self._keys: dict[Endpoints, str] = {}  # the config key naming each
        for lane in self.lanes:
            where = lane.endpoints_or(envs.endpoints)
            ids = self._env_ids.setdefault(where, [])
            if lane.env_id not in ids:
                ids.append(lane.env_id)
            key = "data.envs.endpoints" if lane.endpoints is None else f"{lane.key}.endpoints"
            self._keys.setdefault(where, key)
        self.pools: dict[Endpoints, EnvPool] = {}
        self.specs: dict[str, Any] = {}  # lane key -> the `EnvSpec` its server reported to the probe

    def spec_of(self, lane: LaneSpec) -> Any:
        """The spec ``lane``'s server reported (a protocol `EnvSpec`), or None (an agent's lane, or not probed)."""
        return self.specs.get(lane.key)

    def pools_for(self, lanes: tuple[LaneSpec, ...]) -> dict[str, EnvPool]:
        """Each lane's pool, by tag."""
        return {lane.tag: self.pools[lane.endpoints_or(self.envs.endpoints)] for lane in lanes if lane.agent is None}

    async def start(self, tokenizer: Any, vision: ImageEncoder | None = None) -> None:
        self.pools = {where: self.envs.pool(where, ids) for where, ids in self._env_ids.items()}
        try:
            await asyncio.gather(*(self._start(where, pool) for where, pool in self.pools.items()))
            for lane in self.lanes:
                await self._probe(lane, tokenizer, vision)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)

    async def _start(self, where: Endpoints, pool: EnvPool) -> None:
        key = self._keys[where]
        try:
            await pool.start()
        except EndpointRefused as err:
            raise RolloutConfigError(f"data.envs.token: {err}") from err
        except EndpointTlsMismatch as err:
            raise RolloutConfigError(f"data.envs.tls_root_cert: {err.detail}") from err
        except StartTimedOut as err:
            raise RolloutConfigError(
                f"{key}={_show(where)}: nothing there was reachable and serving after {err.seconds:g}s "
                "(data.envs.start_timeout_s): check that a server runs at that address, or raise the timeout if it "
                "needs longer to start"
            ) from err
        except NoEndpointAvailable as err:
            raise RolloutConfigError(f"{key}={_show(where)}: {err}") from err
        except RuntimeError as err:  # a local server did not start: usually a bad env id or import
            envs = ", ".join(
                dict.fromkeys(
                    f"{x.key}.env_id={x.env_id!r}" for x in self.lanes if x.endpoints_or(self.envs.endpoints) == where
                )
            )
            raise RolloutConfigError(f"{envs}: the local env server did not start: {err}") from err

    async def _probe(self, lane: LaneSpec, tokenizer: Any, vision: ImageEncoder | None) -> None:
        """One throw-away session per lane, so a wrong env id, config or context budget fails now."""
        where = lane.endpoints_or(self.envs.endpoints)
        pool = self.pools[where]
        if not await pool.wait_serving(lane.env_id):
            served = "; ".join(f"{address}: {', '.join(ids) or 'nothing'}" for address, ids in pool.served().items())
            raise RolloutConfigError(
                f"{lane.key}.env_id={lane.env_id!r}: no endpoint of {self._keys[where]}={_show(where)} serves "
                f"it (they serve {served}); start a server for it or give this env its own endpoints"
            )
        try:
            session = await pool.open(lane.env_id, lane.env_config)
        except EpisodeFailed as err:
            raise RolloutConfigError(
                f"{lane.key}.env_id={lane.env_id!r} with {lane.key}.env_config={lane.env_config}: {err.detail}"
            ) from err
        self.specs[lane.key] = session.spec
        try:
            started = time.perf_counter()
            try:
                first = await session.reset(seed=1)
            except EpisodeFailed:
                return  # a fault, not a config error: left to the run's retries
            episode = Episode(0, 0, 1, lane.env_id, tag=lane.tag)
            builder = EpisodeBuilder(tokenizer, lane.episode, session.spec, episode, set(), vision)
            builder.start(first, time.perf_counter() - started)
            builder.next_request()
        except ContextBudgetError as err:
            raise RolloutConfigError(f"{lane.key}.episode.max_context_tokens: {err}") from err
        except (ImageInputError, ToolHistoryError) as err:
            raise RolloutConfigError(f"{lane.key}.env_config={lane.env_config}: {err}") from err
        finally:
            await session.close()


def _show(where: Endpoints) -> str:
    return where if isinstance(where, str) else repr(list(where))
