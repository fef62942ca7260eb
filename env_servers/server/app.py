"""Assemble and run an env server: EnvService, health, reflection, TLS, bearer token, reaper, drain.

Start it with `await server.start()`, `EnvServer.run_in_thread(...)` or `python -m env_servers serve`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from env_servers.ports import check_bindable
from env_servers.server.guards import SERVICE_NAME, DecodeGuard, TokenInterceptor, receive_limit, token_problem
from env_servers.server.service import EnvService
from env_servers.server.sessions import SessionTable, close_env
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

log = logging.getLogger("env_servers")
SEND_LIMIT_BYTES = 64 * 1024 * 1024  # a batch of observations with up to 8 x 2 MiB images each
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DRAIN_POLL_S = 0.05


@dataclass(frozen=True)
class ServerConfig:
    """Everything `python -m env_servers serve` can set."""

    env_ids: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port (`EnvServer.port`)
    max_sessions: int = 4096
    session_ttl_s: float = 600.0
    max_action_bytes: int = 65536
    max_message_bytes: int | None = None  # None: `receive_limit(max_action_bytes)`
    workers: int = 4
    drain_seconds: float = 10.0
    token: str | None = None
    tls_cert: bytes | None = None
    tls_key: bytes | None = None
    seed: int | None = None  # for the seeds of unseeded Resets
    env_configs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reflection_versions: tuple[str, ...] = ("v1", "v1alpha")

    def __post_init__(self) -> None:
        if not self.env_ids:
            raise ValueError("env_ids: serve at least one env")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.session_ttl_s <= 0:
            raise ValueError(f"session_ttl_s must be > 0, got {self.session_ttl_s}")
        if self.max_action_bytes < 1:
            raise ValueError(f"max_action_bytes must be >= 1, got {self.max_action_bytes}")
        if self.max_message_bytes is not None and self.max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be >= 1, got {self.max_message_bytes}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        if not self.reflection_versions or set(self.reflection_versions) - {"v1", "v1alpha"}:
            raise ValueError(f"reflection_versions: v1 and/or v1alpha, got {self.reflection_versions}")
        if self.token is not None and (problem := token_problem(self.token)):
            raise ValueError(f"token {problem}; give a real token, or None to serve without authentication")

    @property
    def receive_bytes(self) -> int:
        """The largest request the server reads (larger: RESOURCE_EXHAUSTED)."""
        return self.max_message_bytes or receive_limit(self.max_action_bytes)


def add_reflection(server: grpc.aio.Server, versions: tuple[str, ...]) -> None:
    """Server reflection as grpc.reflection.v1 and/or v1alpha. grpcio-reflection ships v1alpha only; v1 has the
    same messages under another name, so the same servicer serves it."""
    v1 = "grpc.reflection.v1.ServerReflection"
    names = (SERVICE_NAME, "grpc.health.v1.Health", *((reflection.SERVICE_NAME,) if "v1alpha" in versions else ()))
    names = (*names, *((v1,) if "v1" in versions else ()))
    if "v1alpha" in versions:
        reflection.enable_server_reflection(names, server)
    if "v1" in versions:
        servicer = reflection.aio.ReflectionServicer(names)
        handler = grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(v1, {"ServerReflectionInfo": handler}),))


class EnvServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.table = SessionTable(
            list(config.env_ids),
            max_sessions=config.max_sessions,
            session_ttl_s=config.session_ttl_s,
            seed=config.seed,
            env_configs=config.env_configs,
        )
        self.service = EnvService(self.table, max_action_bytes=config.max_action_bytes, workers=config.workers)
        self.health = health_async.HealthServicer()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._stopped: asyncio.Event | None = None  # made on the server's loop

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        cfg = self.config
        # Token first: a refused call is answered before anything reads its body.
        interceptors: list[grpc.aio.ServerInterceptor] = [DecodeGuard(cfg.max_action_bytes)]
        if cfg.token is not None:
            interceptors.insert(0, TokenInterceptor(cfg.token))
        options = [
            ("grpc.max_receive_message_length", cfg.receive_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes or SEND_LIMIT_BYTES),
            ("grpc.so_reuseport", 0),
            # BDP probing widens the receive window to megabytes, filled before the token check refuses a call
            # (16 refused 15 MB requests grew a server 6-29 MB; 1.5 MB without). Requests are small.
            ("grpc.http2.bdp_probe", 0),
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        pb_grpc.add_EnvServiceServicer_to_server(self.service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        add_reflection(server, cfg.reflection_versions)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, NOT_SERVING)
        target = f"{cfg.host}:{cfg.port}"
        check_bindable(cfg.host, cfg.port)
        try:
            if cfg.tls_cert is not None:
                creds = grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)])
                self.port = server.add_secure_port(target, creds)
            else:
                self.port = server.add_insecure_port(target)
        except RuntimeError:  # grpc's "Failed to bind to address"
            self.port = 0
        if not self.port:
            raise OSError(f"cannot listen on {target}: the port is in use, or the address is not this host's")
        await server.start()
        self._server = server
        self._stopped = asyncio.Event()
        try:  # SERVING only once one env of each kind has been built (imports, caches, a foreign server reached)
            await asyncio.get_running_loop().run_in_executor(None, self._warm_up)
        except BaseException:
            if self._server is not None:  # not drained meanwhile: stop it here, before the loop goes
                await server.stop(None)
                self._server = None
            raise
        for name in ("", SERVICE_NAME):
            await self.health.set(name, SERVING)
        self._reaper = asyncio.create_task(self._reap_forever())
        log.info("serving %s on %s", ",".join(cfg.env_ids), self.address)

    def _warm_up(self) -> None:
        for env_id, entry in self.table.entries.items():
            close_env(entry.make(entry.make_config(self.table.env_configs.get(env_id, {}))))

    async def _reap_forever(self) -> None:
        period = min(30.0, max(0.05, self.config.session_ttl_s / 4))
        while True:
            await asyncio.sleep(period)
            closed = self.table.reap_idle()
            if closed:
                log.info("closed %d idle sessions", closed)

    async def drain_and_stop(self, grace: float | None = None) -> None:
        """Graceful drain (env.proto, "Draining"): refuse new work, serve steps until no episode is in progress
        or ``grace`` (default: the drain period) is over, then stop."""
        if self._server is None:
            return
        self.service.draining = True
        await self.health.enter_graceful_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.drain_seconds if grace is None else grace)
        while self.table.episodes_in_progress() and loop.time() < deadline:
            await asyncio.sleep(min(DRAIN_POLL_S, max(0.0, deadline - loop.time())))
        if self._reaper:
            self._reaper.cancel()
        await self._server.stop(max(0.1, min(1.0, deadline - loop.time())))
        self.service.pool.shutdown(wait=False, cancel_futures=True)
        self.table.close_all()
        self._server = None
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    @classmethod
    def run_in_thread(cls, config: ServerConfig) -> RunningServer:
        """Start a server on a private event loop in a daemon thread."""
        server = cls(config)
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(server.start())
            except BaseException as exc:  # re-raised in the caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_until_complete(server.wait_stopped())

        thread = threading.Thread(target=main, name=f"env-server-{config.port}", daemon=True)
        thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return RunningServer(server, loop, thread)


@dataclass
class RunningServer:
    server: EnvServer
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, grace: float = 0.5) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.server.drain_and_stop(grace), self.loop).result(timeout=grace + 10)
            self.thread.join(timeout=10)


async def serve_forever(config: ServerConfig, *, announce: Any = None) -> None:
    """Run until SIGTERM/SIGINT, then drain."""
    server = EnvServer(config)
    await server.start()
    if announce:
        announce(server)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("draining (up to %.1fs)", config.drain_seconds)
    await server.drain_and_stop()
