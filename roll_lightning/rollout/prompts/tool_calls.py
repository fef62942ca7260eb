"""Tool calls out of a reply, one parser per model family; a call that does not parse keeps its text, nameless,
for the env to refuse.
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
    """A tool's name and its arguments as JSON text."""

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
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5/3, SmolLM3)."""

    name: ClassVar[str] = "hermes"
    # an unclosed last block (out of tokens) is still a call
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, reply: str) -> list[ParsedCall]:
        return [_json_call(block.strip()) for block in self._BLOCK.findall(reply)]


class Llama3JsonParser(ToolParser):
    """Llama 3.1/3.2: the reply is ``{"name": ..., "parameters": {...}}``, several joined by ``;``."""

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
    """``[TOOL_CALLS]`` then a JSON list of calls, or (newer tokenizers) ``name[ARGS]{...}`` per call."""

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
    """Llama 3.2/4: a Python list of calls with literal keyword arguments, ``[f(x=1), g(y="a")]``."""

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
    """A call written as JSON."""
    try:
        return _call_of(json.loads(body), body)
    except json.JSONDecodeError:
        return ParsedCall("", body)


def _call_of(value: object, body: str) -> ParsedCall:
    """A decoded JSON call; anything else a nameless call keeping ``body``."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return ParsedCall("", body)
    arguments = value.get("arguments", value.get("parameters", {}))
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ParsedCall(value["name"], text)


def _pythonic_call(node: ast.expr) -> ParsedCall:
    """``name(key=literal, ...)`` as a call; other forms nameless."""
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
    """The parser called ``name`` (a `ToolParser` passes through)."""
    if isinstance(name, ToolParser):
        return name
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {name!r}: choose one of {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]
