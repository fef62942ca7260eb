"""A chat call's body read into one typed `ChatRequest`, or a 400 naming the field that is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_lightning.rollout.agents.endpoint_errors import RequestError
from roll_lightning.rollout.engines.base import SamplingParams

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatRequest:
    """What a `POST /chat/completions` asks for, as the endpoint answers it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    logprobs: bool  # the caller wants each token's log-prob back
    clamped: bool  # its ``max_tokens`` was over the run's reply budget and was cut to it


def read_chat_request(body: dict[str, Any], max_tokens: int, temperature: float | None) -> ChatRequest:
    """``body`` checked field by field. ``max_tokens``: the run's reply budget (the default and the most a call
    gets); ``temperature``: when set (training), every call is sampled at it with top_p 1."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(400, f"messages[{k}].role must be one of {', '.join(ROLES)}", f"messages[{k}]")
        content = m.get("content")
        if not (content is None or isinstance(content, str) or _text_parts(content)):
            raise RequestError(400, f"messages[{k}].content must be text", f"messages[{k}].content")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_tool(t) for t in tools)):
        raise RequestError(400, "tools must be a list of {type: function, function: {name, ...}}", "tools")
    if body.get("n", 1) != 1:
        raise RequestError(400, "only n=1 is supported", "n")
    if body.get("stream"):
        raise RequestError(400, "streaming is not supported", "stream")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    budget = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), max_tokens)
    checks = {
        "temperature": (body.get("temperature", 1.0), lambda v: number(v) and 0 <= v <= 2),
        "top_p": (body.get("top_p", 1.0), lambda v: number(v) and 0 < v <= 1),
        "max_tokens": (budget, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
        "stop": (stop, lambda v: isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) and s for s in v)),
        "logprobs": (body.get("logprobs", False), lambda v: isinstance(v, bool)),
    }
    for name, (value, ok) in checks.items():
        if not ok(value):
            raise RequestError(400, f"{name}={value!r} is not allowed", name)
    top_p = body.get("top_p", 1.0)
    if temperature is None:
        temperature = body.get("temperature", 1.0)
    else:
        top_p = 1.0
    sampling = SamplingParams(
        max_new_tokens=min(budget, max_tokens), temperature=temperature, top_p=top_p, stop=tuple(stop)
    )
    return ChatRequest(messages, tools, sampling, body.get("logprobs", False), clamped=budget > max_tokens)


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _text_parts(content: Any) -> bool:
    return isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content)


def _is_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "name" in tool["function"]
