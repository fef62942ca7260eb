"""Two ways to reach an OpenEnv environment, in process or over its WebSocket protocol, both answering an
`Outcome` and failing as `InvalidAction` (a normal invalid step) or `ForeignEnvFailed` (the episode aborts).
"""

from __future__ import annotations

import concurrent.futures
import importlib
import inspect
import json
import typing
from dataclasses import dataclass
from typing import Any

from env_servers.api import EnvUnavailable

_WIRE = ("done", "reward", "metadata")  # OpenEnv's Observation base fields


class InvalidAction(ValueError):
    """The foreign env (or its action type) refused the action as malformed."""


class ForeignEnvFailed(EnvUnavailable):
    """The foreign env failed: an exception, a timeout, a lost connection or a malformed answer."""


class SessionsFull(ForeignEnvFailed):
    """An OpenEnv server refused a session at its capacity (``CAPACITY_REACHED``), naming its ``max_sessions``."""

    def __init__(self, message: str, max_sessions: int) -> None:
        super().__init__(message)
        self.max_sessions = max_sessions


@dataclass(frozen=True)
class Outcome:
    """One OpenEnv answer."""

    fields: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any]

    @classmethod
    def parse(cls, observation: Any, reward: Any, done: Any, where: str) -> Outcome:
        if not isinstance(observation, dict):
            raise ForeignEnvFailed(f"{where}: malformed answer: the observation is {type(observation).__name__}")
        if reward is not None and (isinstance(reward, str) or not isinstance(reward, int | float)):
            raise ForeignEnvFailed(f"{where}: malformed answer: reward {reward!r} is not a number")
        if not isinstance(done, bool):
            raise ForeignEnvFailed(f"{where}: malformed answer: done {done!r} is not a boolean")
        metadata = observation.get("metadata") or {}
        fields = {k: v for k, v in observation.items() if k not in _WIRE}
        return cls(
            fields, None if reward is None else float(reward), done, metadata if isinstance(metadata, dict) else {}
        )


def load(ref: str) -> Any:
    """The object named ``module:attribute``."""
    module, _, name = ref.rpartition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise KeyError(f"cannot load {ref!r} ({type(exc).__name__}: {exc})") from exc


def action_type(env_cls: type, override: str = "") -> type:
    """The env's Action class: ``override``, the declared ``ActT``, `CallToolAction` for an MCP env, or ``step``'s
    annotation."""
    if override:
        return load(override)
    for klass in env_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                return args[0]
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.mcp_types import CallToolAction
    from openenv.core.env_server.types import Action

    if issubclass(env_cls, MCPEnvironment):
        return CallToolAction
    try:
        hinted = typing.get_type_hints(env_cls.step).get("action")
    except Exception:  # annotations that do not resolve here
        hinted = None
    if isinstance(hinted, type) and issubclass(hinted, Action) and hinted is not Action:
        return hinted
    raise KeyError(f"{env_cls.__name__} does not declare its Action type: give config.action_class")


class InProcess:
    """An OpenEnv `Environment` made here by ``factory``; each call runs on the instance's own thread, bounded by
    ``timeout_s``."""

    def __init__(self, factory: Any, action_class: str, timeout_s: float) -> None:
        self.name, self.timeout_s = getattr(factory, "__name__", "env"), timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"openenv-{self.name}")
        self.env = self._call("start", factory)
        self.action_cls = action_type(type(self.env), action_class)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        future = self._pool.submit(fn, *args, **kwargs)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError as exc:
            self._pool.shutdown(wait=False)  # the stuck call keeps its thread
            self._pool = _Refusing(f"{self.name} timed out earlier")
            raise ForeignEnvFailed(f"OpenEnv env {self.name}: {what} timed out after {self.timeout_s:g}s") from exc
        except (InvalidAction, ForeignEnvFailed):
            raise
        except Exception as exc:
            raise ForeignEnvFailed(f"OpenEnv env {self.name}: {what} raised {type(exc).__name__}: {exc}") from exc

    def _outcome(self, observation: Any, where: str) -> Outcome:
        if not hasattr(observation, "model_dump"):
            raise ForeignEnvFailed(f"{where}: malformed answer: {type(observation).__name__} is not an Observation")
        data = observation.model_dump(mode="json")
        return Outcome.parse(data, data.get("reward"), data.get("done"), where)

    def reset(self, seed: int, kwargs: dict[str, Any]) -> Outcome:
        accepted = _accepted(self.env.reset, {"seed": seed, **kwargs})  # some take no seed
        return self._outcome(self._call("reset", self.env.reset, **accepted), f"{self.name} reset")

    def step(self, action: dict[str, Any]) -> Outcome:
        import pydantic

        cls = self.action_cls
        if action.get("type") in ("call_tool", "list_tools"):
            from openenv.core.env_server import mcp_types

            cls = mcp_types.CallToolAction if action["type"] == "call_tool" else mcp_types.ListToolsAction
        try:
            typed = cls.model_validate(action)
        except pydantic.ValidationError as exc:
            raise InvalidAction(_first_error(exc)) from exc
        return self._outcome(self._call("step", self.env.step, typed), f"{self.name} step")

    def action_schema(self) -> dict[str, Any]:
        return self.action_cls.model_json_schema()

    def description(self) -> str:
        """The env's ``get_metadata`` description, or ''."""
        get = getattr(self.env, "get_metadata", None)
        return str(getattr(self._call("get_metadata", get), "description", "") or "") if callable(get) else ""

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close) and not isinstance(self._pool, _Refusing):
            try:
                self._call("close", close)
            except ForeignEnvFailed:
                pass
        self._pool.shutdown(wait=False)


class _Refusing:
    """The executor after a timeout: every further call fails at once."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def submit(self, *_: Any, **__: Any) -> Any:
        raise ForeignEnvFailed(self.reason)

    def shutdown(self, wait: bool = True) -> None:
        pass


class Remote:
    """A running OpenEnv server, one ``/ws`` session per instance, spoken synchronously on the calling thread as
    `GenericEnvClient` speaks it but without its event-loop thread per session (docs/benchmarks.md)."""

    def __init__(self, url: str, connect_timeout_s: float, timeout_s: float) -> None:
        from openenv.core.utils import convert_to_ws_url

        self.url, self.timeout_s, self.connect_timeout_s = url.rstrip("/"), timeout_s, connect_timeout_s
        self.ws_url = f"{convert_to_ws_url(self.url)}/ws"
        self._ws: Any = None  # lazy: a server may take one session at a time

    def _exchange(self, what: str, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message and return its answer's ``data``."""
        from websockets.exceptions import ConnectionClosed, WebSocketException
        from websockets.sync.client import connect

        try:
            if self._ws is None:
                self._ws = connect(  # no deflate: small messages
                    self.ws_url, open_timeout=self.connect_timeout_s, max_size=None, proxy=None, compression=None
                )
            try:
                self._ws.send(json.dumps(message))
            except ConnectionClosed:
                pass  # a server that refused the session (at capacity) said why before it closed: read that below
            answer = json.loads(self._ws.recv(timeout=self.timeout_s))
        except TimeoutError as exc:
            self._drop()
            raise ForeignEnvFailed(f"OpenEnv server {self.url}: {what} timed out after {self.timeout_s:g}s") from exc
        except ConnectionClosed as exc:
            self._drop()
            raise ForeignEnvFailed(
                f"OpenEnv server {self.url}: {what} failed: the session was closed ({exc}); an OpenEnv server closes "
                "sessions past its max_concurrent_envs"
            ) from exc
        except (OSError, WebSocketException, ValueError) as exc:
            self._drop()
            raise ForeignEnvFailed(f"OpenEnv server {self.url}: {what} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
            raise ForeignEnvFailed(f"OpenEnv server {self.url}: {what}: malformed answer {str(answer)[:200]}")
        if answer.get("type") == "error":
            error = answer["data"]
            detail = f"{error.get('message', 'unknown error')} (code: {error.get('code', 'UNKNOWN')})"
            if error.get("code") == "VALIDATION_ERROR":
                raise InvalidAction(detail)
            if error.get("code") == "CAPACITY_REACHED" and isinstance(error.get("max_sessions"), int):
                self._drop()
                raise SessionsFull(
                    f"OpenEnv server {self.url}: {what} refused: {detail}; it holds {error['max_sessions']} "
                    f"session(s) at once: give the env config max_sessions: {error['max_sessions']}",
                    error["max_sessions"],
                )
            raise ForeignEnvFailed(f"OpenEnv server {self.url}: {what} failed: {detail}")
        return answer["data"]

    def _drop(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    def _outcome(self, data: dict[str, Any], where: str) -> Outcome:
        return Outcome.parse(data.get("observation"), data.get("reward"), data.get("done", False), where)

    def reset(self, seed: int, kwargs: dict[str, Any]) -> Outcome:
        data = self._exchange("reset", {"type": "reset", "data": {"seed": seed, **kwargs}})
        return self._outcome(data, f"{self.url} reset")

    def step(self, action: dict[str, Any]) -> Outcome:
        return self._outcome(self._exchange("step", {"type": "step", "data": action}), f"{self.url} step")

    def action_schema(self) -> dict[str, Any]:
        import httpx

        try:
            answer = httpx.get(f"{self.url}/schema", timeout=self.connect_timeout_s)
        except httpx.TimeoutException as exc:
            raise ForeignEnvFailed(
                f"OpenEnv server {self.url}: no answer to GET /schema within {self.connect_timeout_s:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            raise ForeignEnvFailed(
                f"OpenEnv server {self.url}: cannot connect ({_reason(exc)}); is the server running there?"
            ) from exc
        try:
            schema = answer.json()["action"] if answer.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            schema = None
        if not isinstance(schema, dict):
            said = f"answered {answer.status_code}" if answer.status_code != 200 else "has no action schema"
            raise ForeignEnvFailed(f"{self.url} is not an OpenEnv server: GET /schema {said}")
        return schema

    def description(self) -> str:
        """The server's ``GET /metadata`` description, or ''."""
        import httpx

        try:
            answer = httpx.get(f"{self.url}/metadata", timeout=self.timeout_s)
            return str(answer.json().get("description") or "") if answer.status_code == 200 else ""
        except (httpx.HTTPError, ValueError, AttributeError):
            return ""

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:  # already gone
                pass
            self._drop()


def _reason(exc: BaseException) -> str:
    """The innermost cause's message: ``[Errno 111] Connection refused``, not httpx's wrapper."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return str(exc) or type(exc).__name__


def _accepted(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``fn`` takes."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    names = {p.name for p in params}
    return {k: v for k, v in kwargs.items() if k in names}


def _first_error(exc: Any) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ())) or "action"
    return f"{where}: {error.get('msg', 'invalid')}"
