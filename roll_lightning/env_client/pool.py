"""`EnvPool`: many env server endpoints behind one async API, for the rollout.

Sessions go to the healthy endpoint with the most free capacity and stay there; failing endpoints are ejected
(waiting calls fail at once) and readmitted when SERVING again. A draining endpoint gets no new work but is not
ejected: its episodes in progress keep stepping (env.proto, "Draining"). Usage: docs/envs.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import grpc
from grpc_health.v1 import health_pb2

from roll_lightning.env_client.batching import Batcher, Kind
from roll_lightning.env_client.client import EnvClient
from roll_lightning.env_client.errors import (
    REFUSED,
    EndpointRefused,
    EndpointTlsMismatch,
    EnvOutage,
    EpisodeFailed,
    NoEndpointAvailable,
    StartTimedOut,
    status_code,
)
from roll_lightning.env_client.local import LocalServer, launch_local_server
from roll_lightning.env_client.session import EnvSession, new_request_id
from roll_lightning.env_client.tls import speaks_tls
from roll_lightning.protocol.v1 import env_pb2 as pb

log = logging.getLogger("roll_lightning.env_client")
# how steps travel: a batched call per server, one bidirectional stream, or a call each (every server has unary);
# a new transport is its protocol messages plus its branch in `EnvPool._call`
Transport = Literal["batch", "stream", "unary"]
TRANSPORTS: tuple[str, ...] = get_args(Transport)


@dataclass(eq=False)
class Endpoint:
    address: str
    client: EnvClient
    batcher: Batcher
    capacity: int = 0
    active: int = 0  # as last reported by the server, plus sessions placed since
    creating: int = 0  # CreateSession calls in flight (not yet in the server's count)
    accepting: bool = False  # health SERVING and not draining
    mixed: bool = False  # resets travel inside BatchStep ("batch-mixed")
    capabilities: frozenset[str] = frozenset()
    warned_transport: bool = False
    tls_probed: bool = False
    env_ids: frozenset[str] = frozenset()  # empty until it answers
    ejected: bool = False
    failures: int = 0
    last_error: str = ""  # of the last failed health check
    waiting: set[asyncio.Future[Any]] = field(default_factory=set)  # calls an ejection fails at once

    @property
    def free(self) -> int:
        return self.capacity - self.active


class EnvPool:
    def __init__(
        self,
        endpoints: str | Sequence[str] = "local",
        *,
        local_envs: Sequence[str] = (),
        local_servers: int = 1,
        local_args: Sequence[str] = (),
        token: str | None = None,
        tls_root_cert: bytes | None = None,
        tls_server_name: str | None = None,
        transport: Transport = "batch",
        call_timeout_s: float = 30.0,
        reset_timeout_s: float = 120.0,
        health_interval_s: float = 1.0,
        health_timeout_s: float = 1.0,
        eject_after: int = 2,
        start_timeout_s: float = 30.0,
        max_batch: int = 256,
        max_inflight_batches: int = 2,
        mixed_batches: bool = False,
        outage_timeout_s: float = 300.0,
    ) -> None:
        """
        Args:
            endpoints: ``"local"`` (spawn `local_servers` servers for `local_envs`) or ``host:port`` list.
            transport: ``batch`` (calls share one RPC), ``stream`` (one bidi stream) or ``unary``.
            call_timeout_s: deadline of a Step or CreateSession; reset_timeout_s: of a Reset.
            eject_after: failed health checks in a row before an endpoint is ejected.
            start_timeout_s: how long `start` waits for a first SERVING endpoint.
            outage_timeout_s: how long `open` waits once every endpoint is down (0 = raise `EnvOutage` at once).
            mixed_batches: resets inside BatchStep; off by default: costs free-running overlap (docs/benchmarks.md).
        """
        if isinstance(endpoints, str) and endpoints != "local":
            endpoints = [endpoints]
        if endpoints == "local" and not local_envs:
            raise ValueError("endpoints='local' needs local_envs: the env ids the local servers should serve")
        if not isinstance(endpoints, str) and not endpoints:
            raise ValueError("endpoints: give 'local' or at least one host:port")
        for address in [] if isinstance(endpoints, str) else endpoints:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"endpoints: '{address}' is not host:port")
        if outage_timeout_s < 0:
            raise ValueError(f"outage_timeout_s must be >= 0, got {outage_timeout_s}")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self._addresses = endpoints
        self._local_envs, self._local_servers, self._local_args = list(local_envs), local_servers, list(local_args)
        self._client_kwargs = {"token": token, "tls_root_cert": tls_root_cert, "tls_server_name": tls_server_name}
        self.transport: Transport = transport
        self.call_timeout_s, self.reset_timeout_s = call_timeout_s, reset_timeout_s
        self.health_interval_s, self.health_timeout_s = health_interval_s, health_timeout_s
        self.eject_after, self.start_timeout_s = eject_after, start_timeout_s
        self.max_batch, self.max_inflight_batches = max_batch, max_inflight_batches
        self.mixed_batches = mixed_batches
        self.outage_timeout_s = outage_timeout_s
        self._available = asyncio.Event()  # some endpoint can take sessions
        self._down_since: float | None = None  # loop time
        self.endpoints: list[Endpoint] = []
        self.local: list[LocalServer] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.open_sessions: set[EnvSession] = set()  # opened here and not closed yet (`close` closes them)
        self._limits: dict[str, int] = {}  # env id -> its spec's max_sessions, when set (`open`)
        self._gates: dict[str, asyncio.Semaphore] = {}
        self.stats = {
            "ejections": 0,
            "readmissions": 0,
            "resets": 0,
            "failed_calls": 0,
            "forks": 0,  # ForkSession calls (`EnvSession.fork`) ...
            "forked_sessions": 0,  # ... and the copies they made
        }

    # -- lifecycle -----------------------------------------------------------------------------------

    async def __aenter__(self) -> EnvPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        if self._addresses == "local":
            loop = asyncio.get_running_loop()
            launches = [
                loop.run_in_executor(None, lambda: launch_local_server(self._local_envs, extra_args=self._local_args))
                for _ in range(self._local_servers)
            ]
            self.local = list(await asyncio.gather(*launches))
            addresses = [server.address for server in self.local]
        else:
            addresses = list(self._addresses)
        self.endpoints = [self._endpoint(a) for a in addresses]
        deadline = asyncio.get_running_loop().time() + self.start_timeout_s
        while True:  # servers may still be loading (NOT_SERVING)
            checks = await asyncio.gather(*(self._check(ep) for ep in self.endpoints), return_exceptions=True)
            if failed := next((c for c in checks if isinstance(c, BaseException)), None):
                await self.close()  # e.g. EndpointRefused: a wrong token does not fix itself
                raise failed
            if any(ep.accepting for ep in self.endpoints):
                break
            if asyncio.get_running_loop().time() >= deadline:
                await self.close()
                raise StartTimedOut(self.start_timeout_s, addresses)
            await asyncio.sleep(min(0.25, self.health_interval_s))
        self._note_availability()
        for ep in self.endpoints:
            self._tasks.append(asyncio.create_task(self._watch(ep)))
            self._tasks.append(asyncio.create_task(ep.batcher.flush_forever("reset")))
            self._tasks.append(asyncio.create_task(ep.batcher.flush_forever("step")))

    def _endpoint(self, address: str) -> Endpoint:
        client = EnvClient(address, **self._client_kwargs)
        waiting: set[asyncio.Future[Any]] = set()
        batcher = Batcher(client, address, waiting, max_batch=self.max_batch, max_inflight=self.max_inflight_batches)
        return Endpoint(address, client, batcher, waiting=waiting)

    async def close(self) -> None:
        """Close the sessions still open (a server's drain waits for their episodes), then the clients, then stop
        the local servers."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await asyncio.gather(*(session.close() for session in list(self.open_sessions)), return_exceptions=True)
        await asyncio.gather(*(ep.client.close() for ep in self.endpoints), return_exceptions=True)
        if self.local:
            await asyncio.get_running_loop().run_in_executor(None, lambda: [s.stop() for s in self.local])
            self.local = []

    # -- health and placement ------------------------------------------------------------------------

    async def _check(self, ep: Endpoint) -> None:
        try:
            status = await ep.client.health(self.health_timeout_s)
            if status == health_pb2.HealthCheckResponse.SERVING:
                info = await ep.client.server_info(self.health_timeout_s)
                ep.capacity = info.max_sessions
                ep.env_ids = frozenset(info.env_ids)
                if not ep.creating:  # otherwise the server's count misses our in-flight placements
                    ep.active = info.active_sessions
                ep.accepting = not info.draining
                ep.capabilities = frozenset(info.capabilities)
                ep.mixed = self.mixed_batches and "batch-mixed" in info.capabilities
                if self.transport != "unary" and self.transport not in ep.capabilities and not ep.warned_transport:
                    ep.warned_transport = True
                    log.warning(
                        "env endpoint %s does not offer the %r transport (capabilities: %s); using unary calls",
                        ep.address, self.transport, ", ".join(sorted(ep.capabilities)) or "none",
                    )  # fmt: skip
            else:
                ep.accepting = False
            if ep.ejected:
                log.warning("env endpoint %s is back; readmitting it", ep.address)
                ep.ejected = False
                self.stats["readmissions"] += 1
            ep.failures = 0
        except EpisodeFailed as err:
            if err.code in REFUSED and not self._tasks:  # in `start`: a config error
                raise EndpointRefused(err.code, err.detail, endpoint=ep.address) from err
            if err.code == grpc.StatusCode.UNAVAILABLE and not self._tasks and not ep.tls_probed:
                await self._check_tls(ep)
            ep.failures += 1
            ep.accepting = False
            ep.last_error = str(err)
            if ep.failures >= self.eject_after and not ep.ejected:
                self._eject(ep, err)
        if self._tasks:  # past `start`
            self._note_availability()

    async def _check_tls(self, ep: Endpoint) -> None:
        """In `start`, raise if an unreachable endpoint disagrees with this client about TLS (a config error)."""
        tls = await speaks_tls(ep.address)
        if tls is None:
            return  # not reachable yet: ask again at the next check
        ep.tls_probed = True
        client_tls = self._client_kwargs["tls_root_cert"] is not None
        if tls != client_tls:
            raise EndpointTlsMismatch(ep.address, server_tls=tls)

    def _note_availability(self) -> None:
        if self.healthy_endpoints():
            self._down_since = None
            self._available.set()
        elif self._available.is_set() or self._down_since is None:
            self._down_since = asyncio.get_running_loop().time()
            self._available.clear()
            log.warning(
                "every env endpoint is down; new episodes wait up to %gs for one to come back", self.outage_timeout_s
            )

    def _stop_placing(self, ep: Endpoint) -> None:
        """``ep`` is draining: no new work there until a health check says otherwise."""
        ep.accepting = False
        if self._tasks:
            self._note_availability()

    @property
    def in_outage(self) -> bool:
        return not self.healthy_endpoints()

    async def wait_available(self, env_id: str | None = None) -> None:
        """Return once an endpoint (serving ``env_id``) is healthy; raise `EnvOutage` after `outage_timeout_s`."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self.healthy_endpoints(env_id):
            since = self._down_since if self._down_since is not None else started
            left = since + self.outage_timeout_s - loop.time()
            if left <= 0:
                raise EnvOutage(self._outage_message(loop.time() - since))
            if self.healthy_endpoints():  # only this env's endpoints are down: poll
                await asyncio.sleep(min(left, self.health_interval_s))
                continue
            try:
                async with asyncio.timeout(left):
                    await self._available.wait()
            except TimeoutError:
                pass

    def _outage_message(self, down_s: float) -> str:
        states = "; ".join(
            f"{ep.address} ({'ejected' if ep.ejected else 'not serving'}: {ep.last_error or 'no answer yet'})"
            for ep in self.endpoints
        )
        return (
            f"every env endpoint has been down for {down_s:.0f}s, longer than the outage timeout "
            f"({self.outage_timeout_s:g}s, data.envs.outage_timeout_s): {states}"
        )

    def _eject(self, ep: Endpoint, err: EpisodeFailed) -> None:
        log.warning("ejecting env endpoint %s after %d failed health checks: %s", ep.address, ep.failures, err)
        ep.ejected = True
        self.stats["ejections"] += 1
        failure = EpisodeFailed(
            grpc.StatusCode.UNAVAILABLE, f"endpoint ejected as unhealthy ({err.detail})", endpoint=ep.address
        )
        for fut in list(ep.waiting):
            if not fut.done():
                fut.set_exception(failure)

    async def _watch(self, ep: Endpoint) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self._check(ep)

    def healthy_endpoints(self, env_id: str | None = None) -> list[str]:
        return [ep.address for ep in self.endpoints if ep.accepting and not ep.ejected and _serves(ep, env_id)]

    def served(self) -> dict[str, list[str]]:
        return {ep.address: sorted(ep.env_ids) for ep in self.endpoints}

    def _nobody_serves(self, env_id: str) -> bool:
        """No endpoint serves ``env_id``, so waiting cannot help."""
        return all(ep.env_ids for ep in self.endpoints) and not any(env_id in ep.env_ids for ep in self.endpoints)

    async def wait_serving(self, env_id: str) -> bool:
        """Wait up to ``start_timeout_s`` for a healthy endpoint serving ``env_id``; False if none comes."""
        deadline = asyncio.get_running_loop().time() + self.start_timeout_s
        while not self.healthy_endpoints(env_id):
            answered = all(ep.env_ids or ep.ejected for ep in self.endpoints)
            if answered or asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(min(0.25, self.health_interval_s))
        return True

    async def open(self, env_id: str, config: dict[str, Any] | None = None, *, tag: str = "") -> EnvSession:
        """A new session of ``env_id``. An env whose spec sets ``max_sessions`` gets no more sessions at once from
        this pool: an open waits for a close (a one-session backend serves a whole group, member after member)."""
        request = pb.CreateSessionRequest(env_id=env_id, request_id=new_request_id(), client_tag=tag)
        if config:
            request.config.update(config)
        gate = self._gates.get(env_id)
        if gate is not None:
            await gate.acquire()
        try:
            session = await self._create(env_id, request)
        except BaseException:
            if gate is not None:
                gate.release()
            raise
        if gate is None and session.spec.max_sessions:  # the env's first session: its limit is known from now on
            self._limits.setdefault(env_id, session.spec.max_sessions)
            gate = self._gates.setdefault(env_id, asyncio.Semaphore(self._limits[env_id]))
            await gate.acquire()
        session.gate = gate
        return session

    def session_limit(self, env_id: str) -> int:
        """Sessions of ``env_id`` this pool holds at once (its spec's ``max_sessions``, once a session told it);
        0: no limit known."""
        return self._limits.get(env_id, 0)

    async def _create(self, env_id: str, request: pb.CreateSessionRequest) -> EnvSession:
        tried: list[str] = []
        last = ""
        while True:
            candidates = [
                ep for ep in self.endpoints if ep.accepting and not ep.ejected and ep.free > 0 and _serves(ep, env_id)
            ]
            candidates = [ep for ep in candidates if ep.address not in tried]
            if not candidates and not tried and self._nobody_serves(env_id):
                raise EpisodeFailed(
                    grpc.StatusCode.NOT_FOUND,
                    f"no env endpoint serves env id '{env_id}' (served: {_served_text(self.served())})",
                )
            if not candidates and not tried and not self.healthy_endpoints(env_id):
                await self.wait_available(env_id)  # an outage
                continue
            if not candidates:
                raise NoEndpointAvailable(
                    f"no endpoint can take a '{env_id}' session (tried: {', '.join(tried) or 'none'}; "
                    f"healthy: {', '.join(self.healthy_endpoints()) or 'none'}){last}"
                )
            ep = max(candidates, key=lambda e: e.free)
            ep.active += 1
            ep.creating += 1
            try:
                reply = await self._await(ep, ep.client.create_session(request, self.call_timeout_s))
            except EpisodeFailed as err:
                ep.active -= 1
                if err.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
                    raise  # a bad env id or config fails the same way everywhere
                if err.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    ep.capacity = ep.active
                if err.draining:
                    self._stop_placing(ep)
                tried.append(ep.address)
                last = f"; the last answered {err.code.name}: {err.detail}"
                continue
            finally:
                ep.creating -= 1
            return EnvSession(self, ep, reply.session_id, reply.spec)

    async def _await(self, ep: Endpoint, coro: Any) -> Any:
        """Await ``coro`` for ``ep``, failing at once if the endpoint is (or gets) ejected."""
        if ep.ejected:
            coro.close()
            raise EpisodeFailed(grpc.StatusCode.UNAVAILABLE, "endpoint is ejected as unhealthy", endpoint=ep.address)
        outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(coro)

        def deliver(done: asyncio.Future[Any]) -> None:
            if outcome.done():
                return
            if done.cancelled():
                outcome.cancel()
            elif done.exception() is not None:
                outcome.set_exception(done.exception())
            else:
                outcome.set_result(done.result())

        task.add_done_callback(deliver)
        ep.waiting.add(outcome)
        try:
            return await outcome
        finally:
            ep.waiting.discard(outcome)
            task.cancel()

    # -- transports ----------------------------------------------------------------------------------

    async def call(self, ep: Endpoint, kind: Kind, request: Any, timeout: float) -> Any:
        """Send one Reset/Step to ``ep``; return the OK item result or raise `EpisodeFailed`."""
        self.stats["resets"] += kind == "reset"
        try:
            return await self._call(ep, kind, request, timeout)
        except EpisodeFailed as err:
            self.stats["failed_calls"] += 1
            if err.draining:
                self._stop_placing(ep)
            raise

    async def fork(self, ep: Endpoint, request: pb.ForkSessionRequest) -> pb.ForkSessionResponse:
        """Fork a session on ``ep`` (`EnvSession.fork`); its copies count as sessions placed there."""
        answer = await self._await(ep, ep.client.fork_session(request, self.call_timeout_s))
        ep.active += len(answer.forks)
        self.stats["forks"] += 1
        self.stats["forked_sessions"] += len(answer.forks)
        return answer

    def counters(self) -> dict[str, int]:
        """Running totals since the pool started (logged as ``env/<name>_total``)."""
        return {
            **self.stats,
            "retried_calls": sum(ep.client.retried_calls for ep in self.endpoints),
            "batches": sum(ep.batcher.batches for ep in self.endpoints),
            "batched_items": sum(ep.batcher.items for ep in self.endpoints),
        }

    async def _call(self, ep: Endpoint, kind: Kind, request: Any, timeout: float) -> Any:
        if ep.ejected:
            raise EpisodeFailed(
                grpc.StatusCode.UNAVAILABLE,
                "endpoint is ejected as unhealthy",
                endpoint=ep.address,
                session_id=request.session_id,
            )
        transport = self.transport if self.transport in ep.capabilities else "unary"
        if transport == "batch":
            result = await ep.batcher.call("step" if ep.mixed else kind, request, timeout)
        elif transport == "stream":
            result = await self._await(ep, ep.client.stream_call(request, timeout))
        else:
            method = ep.client.reset if kind == "reset" else ep.client.step
            result = await self._await(ep, method(request, timeout))
        if result.status.code != 0:
            raise EpisodeFailed(
                status_code(result.status.code),
                result.status.message,
                endpoint=ep.address,
                session_id=request.session_id,
            )
        return result


def _serves(ep: Endpoint, env_id: str | None) -> bool:
    """``ep`` serves ``env_id``; one that lists no env ids serves any."""
    return env_id is None or not ep.env_ids or env_id in ep.env_ids


def _served_text(served: dict[str, list[str]]) -> str:
    return "; ".join(f"{address}: {', '.join(ids) or '?'}" for address, ids in served.items())
