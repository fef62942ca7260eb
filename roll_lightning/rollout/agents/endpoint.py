"""The policy as an OpenAI-compatible chat endpoint for agent programs (docs/agents.md); each call is answered by
the rollout engine and recorded (`agent_record`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from roll_lightning.rollout.agents.chat_request import number, read_chat_request
from roll_lightning.rollout.agents.endpoint_errors import RequestError, http_error, server_error
from roll_lightning.rollout.agents.handout import Handout
from roll_lightning.rollout.agents.record import AgentCall, AgentEpisode, since_last_reply, text_of
from roll_lightning.rollout.agents.runner import LOOPBACK
from roll_lightning.rollout.engines.base import Generates
from roll_lightning.rollout.prompts.chat import reply_body
from roll_lightning.rollout.prompts.tool_calls import ToolParser, tool_parser_named

SERVED_MODEL = "policy"  # the one model `GET /models` lists; a call's own `model` is not checked (docs/agents.md)


@dataclass(frozen=True)
class EndpointConfig:
    """Args:
    host: where to listen; not loopback needs ``token``.
    advertise: the host agents are given (None: ``host``).
    port: 0 picks a free one.
    token: the bearer token every call must carry (None: loopback only).
    max_context_tokens: the most tokens a prompt plus its reply may take.
    max_tokens: a call's default and largest reply budget: a larger ``max_tokens`` is clamped to it.
    max_turns: the most calls an episode may make (None: no bound); later ones are refused.
    max_body_bytes: the largest request body.
    tool_parser: how replies are read into tool calls (`tool_calls`).
    temperature: set in training: every call is sampled at it, with top_p 1.
    """

    host: str = "127.0.0.1"
    advertise: str | None = None
    port: int = 0
    token: str | None = None
    max_context_tokens: int = 4096
    max_tokens: int = 512
    max_turns: int | None = None
    max_body_bytes: int = 1 << 20
    tool_parser: str = "hermes"
    temperature: float | None = None

    def __post_init__(self) -> None:
        if self.host not in LOOPBACK and not self.token:
            raise ValueError(f"endpoint.host {self.host!r} is not loopback: set endpoint.token")
        tool_parser_named(self.tool_parser)


class AgentEndpoint:
    """Answers the chat calls of open episodes with ``engine`` and records them."""

    def __init__(self, engine: Generates, tokenizer: Any, config: EndpointConfig = EndpointConfig()) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.parser: ToolParser = tool_parser_named(config.tool_parser)
        self.stop_ids = {tokenizer.eos_token_id}
        self.episodes: dict[str, AgentEpisode] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.clamped = 0  # calls whose max_tokens was over ``config.max_tokens``, since the start
        self.handout = Handout()
        self.app = Starlette(
            routes=[
                Route("/episodes/{key}/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/episodes/{key}/v1/models", self._models, methods=["GET"]),
                Route("/episodes/{key}/reward", self._reward, methods=["POST"]),
                Route("/episodes/{key}/failed", self._failed, methods=["POST"]),
                Route("/agent/next", self._next, methods=["GET"]),  # long-running agents take episodes here
            ],
            # unknown routes, wrong methods and bugs answer OpenAI-style too, not in plain text
            exception_handlers={HTTPException: http_error, 500: server_error},
        )
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self.base = ""

    async def start(self) -> str:
        """Listen on the running loop; return the base URL."""
        import uvicorn

        c = self.config
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=c.host, port=c.port, log_level="warning"))
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError(f"the agent endpoint did not start on {c.host}:{c.port}")
            await asyncio.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        host = c.advertise or c.host
        self.base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
        return self.base

    async def stop(self) -> None:
        await self.handout.close()  # long polls answer 410 now, so the server need not wait for them
        if self._server is not None:
            self._server.should_exit = True
            await self._task

    def open(self, key: str | None = None) -> str:
        """Open an episode; return its key (unguessable when not given)."""
        key = key or secrets.token_urlsafe(16)
        if key in self.episodes:
            raise ValueError(f"episode {key!r} is already open")
        self.episodes[key] = AgentEpisode(key)
        return key

    def generating(self, key: str) -> bool:
        """True while a call of episode ``key`` is being answered."""
        lock = self._locks.get(key)
        return lock is not None and lock.locked()

    def url(self, key: str) -> str:
        """An episode's OpenAI base URL."""
        return f"{self.base}/episodes/{key}/v1"

    def reward_url(self, key: str) -> str:
        """Where an episode's agent reports its reward."""
        return f"{self.base}/episodes/{key}/reward"

    def agent_url(self) -> str:
        """Where long-running agents take episodes: ``GET {agent_url}/next``."""
        return f"{self.base}/agent"

    def handed(self, key: str, task: dict[str, Any]) -> dict[str, Any]:
        """An episode as `GET /agent/next` hands it to an agent."""
        urls = {"base_url": self.url(key), "reward_url": self.reward_url(key)}
        return {"key": key, **urls, "failed_url": f"{self.base}/episodes/{key}/failed", "task": task}

    def finish(self, key: str) -> AgentEpisode:
        """Close an episode (later calls get 404) and return its record."""
        episode = self.episodes.pop(key)
        self._locks.pop(key, None)
        episode.finished = True
        self.handout.withdraw(key)
        return episode

    async def _chat(self, request: Request) -> JSONResponse:
        episode = None
        try:
            self._authorise(request)
            episode = self._episode(request)
            body = await self._body(request)
            return JSONResponse(await self._answer(episode, body))
        except RequestError as error:
            if episode is not None:
                episode.refused += 1  # not recorded, so not trained; `validate` shows the count
            return error.response()

    async def _models(self, request: Request) -> JSONResponse:
        """The served model, as OpenAI lists models; any open or finished episode's agent may ask."""
        try:
            self._authorise(request)
        except RequestError as error:
            return error.response()
        model = {"id": SERVED_MODEL, "object": "model", "created": 0, "owned_by": "roll_lightning"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _reward(self, request: Request) -> JSONResponse:
        """``{"reward": number, "metrics": {name: number}}``, once per episode."""
        try:
            self._authorise(request)
            episode = self._episode(request)
            body = await self._body(request)
            reward, metrics = body.get("reward"), body.get("metrics", {})
            if not number(reward) or reward != reward or abs(reward) == float("inf"):
                raise RequestError(400, f"reward={reward!r} is not a finite number", "reward")
            if not isinstance(metrics, dict) or not all(isinstance(k, str) and number(v) for k, v in metrics.items()):
                raise RequestError(400, "metrics must map names to numbers", "metrics")
            if episode.ended.is_set():
                why = "was already reported" if episode.error is None else "cannot follow a `failed` report"
                raise RequestError(409, f"the episode's reward {why}", "reward", "conflict_error")
            episode.reward, episode.metrics = float(reward), {k: float(v) for k, v in metrics.items()}
            episode.ended.set()
            return JSONResponse({"ok": True})
        except RequestError as error:
            return error.response()

    async def _failed(self, request: Request) -> JSONResponse:
        """``{"error": text}``: a long-running agent gives an episode up (it fails; the agent plays on)."""
        try:
            self._authorise(request)
            episode = self._episode(request)
            error = (await self._body(request)).get("error")
            if not isinstance(error, str) or not error.strip():
                raise RequestError(400, "error must be a non-empty string saying why", "error")
            if episode.ended.is_set():
                raise RequestError(409, "the episode already ended", "error", "conflict_error")
            episode.error = error.strip()[:2000]
            episode.ended.set()
            return JSONResponse({"ok": True})
        except RequestError as error:
            return error.response()

    async def _next(self, request: Request) -> Response:
        """The next episode for a long-running agent (`handed`), after up to ``?wait=`` seconds (default 30): 204
        when none came, 410 once the run is ending (the agent should exit)."""
        try:
            self._authorise(request)
            try:
                wait_s = float(request.query_params.get("wait", "30"))
            except ValueError:
                raise RequestError(400, "wait must be a number of seconds", "wait") from None
            if not 0 <= wait_s < float("inf"):
                raise RequestError(400, "wait must be a number of seconds", "wait")
            if self.handout.closed:
                raise RequestError(410, "the run is ending: no more episodes", kind="gone")
            taken = await self.handout.take(wait_s)
            if taken is None:
                if self.handout.closed:
                    raise RequestError(410, "the run is ending: no more episodes", kind="gone")
                return Response(status_code=204)
            return JSONResponse(self.handed(*taken))
        except RequestError as error:
            return error.response()

    def _episode(self, request: Request) -> AgentEpisode:
        episode = self.episodes.get(request.path_params["key"])
        if episode is None or episode.finished:
            raise RequestError(404, "unknown or finished episode", kind="not_found_error")
        return episode

    def _authorise(self, request: Request) -> None:
        token = self.config.token
        if token and not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {token}"):
            raise RequestError(401, "a missing or wrong bearer token", kind="authentication_error")

    async def _body(self, request: Request) -> dict[str, Any]:
        limit = self.config.max_body_bytes
        if int(request.headers.get("content-length") or 0) > limit:
            raise RequestError(413, f"the body is over {limit} bytes")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise RequestError(413, f"the body is over {limit} bytes")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise RequestError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError(400, "the body is not a JSON object")
        return body

    async def _answer(self, episode: AgentEpisode, body: dict[str, Any]) -> dict[str, Any]:
        asked = read_chat_request(body, self.config.max_tokens, self.config.temperature)
        messages, tools = asked.messages, asked.tools
        async with self._locks.setdefault(episode.key, asyncio.Lock()):  # an episode's calls, one at a time
            limit = self.config.max_turns
            if limit is not None and len(episode.calls) >= limit:
                raise RequestError(
                    400, f"the episode already made {limit} calls, the most episode.max_turns={limit} allows: "
                    "report its reward instead"
                )  # fmt: skip
            plan = episode.plan(self.tokenizer, messages, tools)
            prompt = plan.prompt_ids
            budget = self.config.max_context_tokens - len(prompt)
            if budget < 1:
                raise RequestError(413, f"the prompt is {len(prompt)} tokens, over the context budget", "messages")
            params = asked.sampling.replace(max_new_tokens=min(asked.sampling.max_new_tokens, budget))
            generation = await self.engine.generate(prompt, params, key=episode.key)
            reply = _assistant_message(self.tokenizer, self.parser, generation.token_ids, self.stop_ids, bool(tools))
            call = AgentCall(
                segment=plan.segment,
                prompt_ids=prompt,
                reply_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs),
                policy_version=generation.policy_version,
                finish_reason=generation.finish_reason,
                shown=since_last_reply(messages),
                reply=text_of(reply.get("content")),
                versions=tuple((int(at), int(v)) for at, v in generation.extra.get("versions", ())),
            )
            episode.record(plan, call, self.stop_ids, reply)  # before answering: a vanished client loses nothing
            self.clamped += asked.clamped
        finish = "tool_calls" if reply.get("tool_calls") else generation.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}
        if asked.logprobs:
            choice["logprobs"] = {"content": self._token_logprobs(generation.token_ids, generation.logprobs)}
        return {
            "id": f"chatcmpl-{episode.key}-{len(episode.calls)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": SERVED_MODEL,
            "system_fingerprint": f"policy-v{generation.policy_version}",
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generation.token_ids),
                "total_tokens": len(prompt) + len(generation.token_ids),
            },
        }

    def _token_logprobs(self, token_ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        out = []
        for token_id, logprob in zip(token_ids, logprobs, strict=True):
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            out.append({"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []})
        return out


def _assistant_message(
    tokenizer: Any, parser: ToolParser, token_ids: list[int], stop_ids: set[int], has_tools: bool
) -> dict[str, Any]:
    """The reply as an OpenAI message; tool-call blocks stay in the text, so it renders back to the sampled tokens."""
    text = reply_body(tokenizer, token_ids, stop_ids)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    calls = parser.parse(text) if has_tools else []
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{k}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for k, c in enumerate(calls)
        ]
    return message


__all__ = ["AgentEndpoint", "EndpointConfig", "RequestError", "text_of"]
