"""Tool calls out of a reply: one parser per model family, chosen once from ``prompt.tool_parser``.

A parser finds the calls a model wrote in its reply text and returns them as ``(name, arguments JSON text)``
pairs, in order, without judging them: a call whose JSON does not parse is still a call (its name empty, its
text kept as the arguments), so the env answers it with an error result and an invalid step, as the protocol
says, instead of the trainer dropping it silently.

- `HermesParser` (``hermes``): Hermes / Qwen2.5 / Qwen3 / SmolLM3 chat templates, where a call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- `Llama3JsonParser` (``llama3_json``): Llama 3.1 / 3.2 with JSON tools, where a reply that is a call is the JSON
  object ``{"name": ..., "parameters": {...}}`` itself (after an optional ``<|python_tag|>``), several joined by ``;``.
- `MistralParser` (``mistral``): Mistral's ``[TOOL_CALLS]`` token followed by a JSON list of calls, or (its newer
  tokenizers) by ``name[ARGS]{...}``, one ``[TOOL_CALLS]`` per call.
- `PythonicParser` (``pythonic``): Llama 3.2 / Llama 4's pythonic calls, a reply that is a Python list of calls
  with literal keyword arguments, ``[get_weather(city="Paris"), answer(value=4)]``.
- `NoToolParser` (``none``): the reply is text only (every env without tools).
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ParsedCall:
    """One call as the model wrote it: the tool's name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolParser(ABC):
    name: ClassVar[str]

    @abstractmethod
    def parse(self, reply: str) -> list[ParsedCall]:
        """The calls in ``reply``, in order (none: a text reply)."""

    def __repr__(self) -> str:
        return f"ToolParser({self.name!r})"

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return tool_parser_named, (self.name,)


class NoToolParser(ToolParser):
    name: ClassVar[str] = "none"

    def parse(self, reply: str) -> list[ParsedCall]:
        return []


class HermesParser(ToolParser):
    name: ClassVar[str] = "hermes"
    # An unclosed block at the end (the reply ran out of tokens) is still a call, judged by the env.
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, reply: str) -> list[ParsedCall]:
        return [_json_call(block.strip()) for block in self._BLOCK.findall(reply)]


class Llama3JsonParser(ToolParser):
    name: ClassVar[str] = "llama3_json"

    def parse(self, reply: str) -> list[ParsedCall]:
        body = reply.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return []  # a text reply
        calls, decoder, at = [], json.JSONDecoder(), 0
        while at < len(body):
            try:
                value, end = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return [*calls, ParsedCall("", body[at:].strip())]  # the rest is one call the env refuses
            calls.append(_call_of(value, body[at:end]))
            at = end
            while at < len(body) and body[at] in "; \n\t":
                at += 1
        return calls


class MistralParser(ToolParser):
    name: ClassVar[str] = "mistral"
    _TOKEN = "[TOOL_CALLS]"

    def parse(self, reply: str) -> list[ParsedCall]:
        if self._TOKEN not in reply:
            return []
        parts = [p.strip() for p in reply.split(self._TOKEN)[1:]]
        if len(parts) == 1 and parts[0].startswith("["):  # [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]
            try:
                values = json.loads(parts[0])
            except json.JSONDecodeError:
                return [ParsedCall("", parts[0])]
            return (
                [_call_of(v, json.dumps(v)) for v in values] if isinstance(values, list) else [ParsedCall("", parts[0])]
            )
        calls = []
        for part in parts:  # [TOOL_CALLS]name[ARGS]{...}
            name, sep, arguments = part.partition("[ARGS]")
            calls.append(ParsedCall(name.strip(), arguments.strip()) if sep and name.strip() else ParsedCall("", part))
        return calls


class PythonicParser(ToolParser):
    name: ClassVar[str] = "pythonic"

    def parse(self, reply: str) -> list[ParsedCall]:
        body = reply.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
        if not (body.startswith("[") and body.endswith("]")):
            return []  # a text reply
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError:
            return [ParsedCall("", body)]
        if not isinstance(tree, ast.List):
            return [ParsedCall("", body)]
        return [_pythonic_call(node) for node in tree.elts]


def _json_call(body: str) -> ParsedCall:
    """A call written as JSON text ``{"name": ..., "arguments" or "parameters": ...}``."""
    try:
        return _call_of(json.loads(body), body)
    except json.JSONDecodeError:
        return ParsedCall("", body)


def _call_of(value: object, body: str) -> ParsedCall:
    """A decoded JSON call; anything else is a call without a name, its ``body`` kept for the env's error."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ParsedCall("", body)
    arguments = value.get("arguments", value.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedCall(value["name"], text)


def _pythonic_call(node: ast.expr) -> ParsedCall:
    """``name(key=literal, ...)`` as a call with JSON arguments; any other form a call without a name."""
    source = ast.unparse(node)
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return ParsedCall("", source)
    try:
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        return ParsedCall(node.func.id, json.dumps(arguments, ensure_ascii=False))
    except (ValueError, TypeError, SyntaxError):
        return ParsedCall("", source)


TOOL_PARSERS: dict[str, ToolParser] = {
    p.name: p for p in (NoToolParser(), HermesParser(), Llama3JsonParser(), MistralParser(), PythonicParser())
}


def tool_parser_named(name: str | ToolParser) -> ToolParser:
    """The parser called ``name`` (a `ToolParser` passes through); an unknown name says which exist."""
    if isinstance(name, ToolParser):
        return name
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {name!r}: choose one of {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]
