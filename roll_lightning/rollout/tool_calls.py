"""Tool calls out of a reply: one parser per model family, chosen once from ``prompt.tool_parser``.

A parser finds the calls a model wrote in its reply text and returns them as ``(name, arguments JSON text)``
pairs, in order, without judging them: a call whose JSON does not parse is still a call (its name empty, its
text kept as the arguments), so the env answers it with an error result and an invalid step, as the protocol
says, instead of the trainer dropping it silently.

- `HermesParser` (``hermes``): Hermes / Qwen2.5 / Qwen3 / SmolLM3 chat templates, where a call is
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
- `NoToolParser` (``none``): the reply is text only (every env without tools).
"""

from __future__ import annotations

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
        calls = []
        for block in self._BLOCK.findall(reply):
            body = block.strip()
            try:
                value = json.loads(body)
            except json.JSONDecodeError:
                calls.append(ParsedCall("", body))
                continue
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                calls.append(ParsedCall("", body))
                continue
            arguments = value.get("arguments", value.get("parameters", {}))
            text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            calls.append(ParsedCall(value["name"], text))
        return calls


TOOL_PARSERS: dict[str, ToolParser] = {p.name: p for p in (NoToolParser(), HermesParser())}


def tool_parser_named(name: str | ToolParser) -> ToolParser:
    """The parser called ``name`` (a `ToolParser` passes through); an unknown name says which exist."""
    if isinstance(name, ToolParser):
        return name
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {name!r}: choose one of {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]
