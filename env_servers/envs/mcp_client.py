"""A blocking handle on one MCP client session (the official `mcp` SDK), for the `mcp:` envs.

All connections share one asyncio loop in a daemon thread. Each is one long-lived task holding the transport and
`ClientSession` until `close()`, because anyio requires context managers to be entered and left in the same task.
Calls may come from any thread; a dropped instance is closed by a weakref finalizer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
import weakref
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
_GRACE_S = 5.0  # added to the SDK's own timeouts for a blocking wait
_CLOSE_WAIT_S = 10.0  # the SDK's stdio shutdown takes up to ~6.5 s (flush, stdin EOF wait, SIGTERM, SIGKILL)


def _loop() -> asyncio.AbstractEventLoop:
    """The process's MCP loop, started on first use."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mcp-client-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


def _import_mcp() -> Any:
    try:
        import mcp
    except ImportError as exc:
        raise RuntimeError("MCP envs need the optional mcp package: pip install 'roll_lightning[mcp]'") from exc
    return mcp


class _State:
    """Shared by the owner task and the finalizer; not the connection, or the task would keep it alive."""

    def __init__(self) -> None:
        self.stop: asyncio.Event | None = None  # created on the loop
        self.owner: concurrent.futures.Future[None] | None = None
        self.session: Any = None


def _shutdown(loop: asyncio.AbstractEventLoop, state: _State, wait_s: float) -> None:
    """Stop the owner task; wait for it unless on the loop's own thread."""
    if state.owner is None or state.owner.done():
        return
    loop.call_soon_threadsafe(lambda: state.stop.set() if state.stop is not None else state.owner.cancel())
    if wait_s > 0 and threading.current_thread().name != "mcp-client-loop":
        try:
            state.owner.result(timeout=wait_s)
        except BaseException:  # noqa: BLE001
            state.owner.cancel()


class McpConnection:
    """An initialised MCP client session to a stdio ``command`` or a streamable-HTTP ``url``.

    Any start-up failure raises one RuntimeError naming the command or URL.
    """

    def __init__(
        self,
        *,
        command: tuple[str, ...] = (),
        url: str = "",
        cwd: str = "",
        env: Mapping[str, str] | None = None,
        start_timeout_s: float = 30.0,
        call_timeout_s: float = 30.0,
    ) -> None:
        _import_mcp()
        if bool(command) == bool(url):
            raise ValueError("give an MCP server command or a url (one of them)")
        self.target = f"command {json.dumps(list(command))}" if command else f"url {url}"
        self.call_timeout_s = call_timeout_s
        self._env = dict(env or {})
        self._loop = _loop()
        self._state = _State()
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._state, _CLOSE_WAIT_S)
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        transport = _transport(command, url, cwd, self._env)
        self._state.owner = asyncio.run_coroutine_threadsafe(
            _own(self._state, transport, start_timeout_s, ready), self._loop
        )
        try:
            self.tools: list[Any] = ready.result(timeout=start_timeout_s + _GRACE_S)
        except BaseException as exc:
            self.close()
            raise RuntimeError(f"MCP server ({self.target}) did not start: {_describe(exc)}") from exc

    @property
    def alive(self) -> bool:
        """The session is up."""
        owner = self._state.owner
        return self._state.session is not None and owner is not None and not owner.done()

    def call(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Run one tool: its `CallToolResult`; TimeoutError, `MCPError` (a refusal) or RuntimeError (server gone)."""
        if not self.alive:
            raise RuntimeError(f"MCP server ({self.target}) is not running")
        coro = self._state.session.call_tool(name, dict(arguments), read_timeout_seconds=self.call_timeout_s)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout=self.call_timeout_s + _GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"tool {name!r} did not answer within {self.call_timeout_s} s") from None
        except Exception as exc:
            from mcp_types import CONNECTION_CLOSED

            if not self.alive or getattr(exc, "code", None) == CONNECTION_CLOSED:
                raise RuntimeError(f"MCP server ({self.target}) went away: {_describe(exc)}") from exc
            raise

    def close(self) -> None:
        """End the session and a stdio server's process; idempotent."""
        self._finalizer()


def _transport(command: tuple[str, ...], url: str, cwd: str, env: Mapping[str, str]) -> Any:
    if url:
        from mcp.client.streamable_http import streamable_http_client

        return streamable_http_client(url)
    from mcp import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(env) or None, cwd=cwd or None)
    return stdio_client(params, errlog=sys.stderr)


async def _own(state: _State, transport: Any, timeout_s: float, ready: concurrent.futures.Future[list[Any]]) -> None:
    """The owner task: connect, list the tools, hold the session until stopped."""
    from mcp import ClientSession
    from mcp.types import PaginatedRequestParams

    state.stop = asyncio.Event()
    try:
        async with AsyncExitStack() as stack:
            read, write = await stack.enter_async_context(transport)
            # read_timeout_seconds bounds initialise and tools/list; calls pass their own timeout.
            session = await stack.enter_async_context(ClientSession(read, write, read_timeout_seconds=timeout_s))
            await session.initialize()
            listing = await session.list_tools()
            tools = list(listing.tools)
            while listing.next_cursor:
                listing = await session.list_tools(params=PaginatedRequestParams(cursor=listing.next_cursor))
                tools.extend(listing.tools)
            state.session = session
            ready.set_result(tools)
            await state.stop.wait()
    except BaseException as exc:
        if not ready.done():
            ready.set_exception(exc)
        if not isinstance(exc, Exception):
            raise
    finally:
        state.session = None


def _describe(exc: BaseException) -> str:
    """A one-line start-up failure (unwrapping anyio's exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, concurrent.futures.TimeoutError | TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
