"""Prompt rendering without tokenisation drift: each prompt segment is the text the chat template adds, tokenised
alone, and reply ids stay as sampled.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from roll_lightning.rollout.prompts.tool_calls import ToolParser, tool_parser_named
from roll_lightning.rollout.prompts.vision import ImageEncoder, Prompt, PromptImage, tokenize

DEFAULT_SYSTEM_PROMPT = (
    "You're a helpful assistant. You are a good game player. You are aiming to get high reward in the game."
)
DEFAULT_TURN_TEMPLATE = (
    "Turn {turn}:\n{observation}\n"
    "You have {actions_left} actions left. Answer in the format {action_format}, e.g. {example_action}."
)


class TemplateDriftError(ValueError):
    """The chat template rendered an earlier turn differently on a later one."""


@dataclass(frozen=True)
class PromptConfig:
    """How observations become chat messages.

    Args:
        system_prompt: the system message ("" = none).
        turn_template: each turn's user message; placeholders ``{turn}`` (1-based), ``{observation}``,
            ``{actions_left}``, ``{action_format}``, ``{example_action}``, ``{max_new_tokens}``.
        instruction_first_turn: put the env's instruction before the first turn's message.
        history_turns: past turns a step row's prompt shows (trajectory rows hold the whole episode).
        reply_prefix: text starting every reply, e.g. ``"<answer>"`` (prompt tokens; the env gets it too).
        tool_parser: how the model writes tool calls (`tool_calls`): ``hermes``, ``llama3_json``, ``mistral``,
            ``pythonic`` or ``none``.
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    turn_template: str = DEFAULT_TURN_TEMPLATE
    instruction_first_turn: bool = True
    history_turns: int = 2
    reply_prefix: str = ""
    tool_parser: str = "hermes"

    def __post_init__(self) -> None:
        tool_parser_named(self.tool_parser)  # an unknown name says which exist
        try:
            self.turn_template.format(
                turn=1, observation="", actions_left=1, action_format="", example_action="", max_new_tokens=1
            )
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"turn_template: unknown or malformed placeholder {err}") from err
        if self.history_turns < 0:
            raise ValueError(f"history_turns must be >= 0, got {self.history_turns}")

    @property
    def reply_parser(self) -> ToolParser:
        return tool_parser_named(self.tool_parser)


def render(
    tokenizer: Any, messages: list[dict[str, str]], *, generation_prompt: bool, tools: list[dict] | None = None
) -> str:
    """The chat template's text of ``messages``; tools go in the system turn when the template ignores them."""
    if tools and not renders_tools(tokenizer):
        messages = with_tools_in_system(messages, tools)
        tools = None
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
    )


TOOLS_SYSTEM = (
    "# Tools\n\nYou may call one or more functions. Function signatures within <tools></tools>:\n<tools>\n{tools}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}'
    "\n</tool_call>"
)
_RENDERS_TOOLS: dict[str, bool] = {}


def renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders ``tools`` (probed once per template)."""
    template = str(getattr(tokenizer, "chat_template", "") or "")
    if template not in _RENDERS_TOOLS:
        probe = [{"type": "function", "function": {"name": "probe_tool_4e1f", "description": "", "parameters": {}}}]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], tools=probe, tokenize=False, add_generation_prompt=True
        )
        _RENDERS_TOOLS[template] = "probe_tool_4e1f" in text
    return _RENDERS_TOOLS[template]


def with_tools_in_system(messages: list[dict[str, str]], tools: list[dict]) -> list[dict[str, str]]:
    """``messages`` with the tool list ending the system message, or as one."""
    listing = TOOLS_SYSTEM.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{listing}"}, *messages[1:]]
    return [{"role": "system", "content": listing}, *messages]


@dataclass
class TokenHistory:
    """One conversation as token ids, their exact text and its pictures."""

    tokenizer: Any
    messages: list[dict[str, str]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    text: str = ""
    encoder: ImageEncoder | None = None
    images: list[PromptImage] = field(default_factory=list)
    tools: list[dict] | None = None  # None: an env without tools

    def copy(self) -> TokenHistory:
        """A copy that grows on its own (a forked episode's, or an agent call's plan)."""
        return replace(self, messages=list(self.messages), ids=list(self.ids), images=list(self.images))

    def add_user(self, content: str, reply_prefix: str = "", images: Sequence[PromptImage] = ()) -> Prompt:
        return self.add_messages([{"role": "user", "content": content}], reply_prefix, images)

    def add_messages(
        self, messages: list[dict[str, str]], reply_prefix: str = "", images: Sequence[PromptImage] = ()
    ) -> Prompt:
        """Append ``messages``, the assistant header and ``reply_prefix``; return the ids added."""
        self.messages.extend(messages)
        full = render(self.tokenizer, self.messages, generation_prompt=True, tools=self.tools)
        if not full.startswith(self.text):
            at = next((i for i, (a, b) in enumerate(zip(full, self.text, strict=False)) if a != b), len(full))
            raise TemplateDriftError(
                "the chat template re-rendered an earlier turn differently (first difference at character "
                f"{at}: {self.text[at : at + 40]!r} became {full[at : at + 40]!r}); trajectory rows need a "
                "prefix-stable template: use layout 'step' with this model"
            )
        delta = full[len(self.text) :] + reply_prefix
        ids = Prompt(tokenize(self.tokenizer, delta, images, self.encoder), images)
        self.ids.extend(ids)
        self.images.extend(images)
        self.text = full + reply_prefix
        return ids

    def add_reply(self, token_ids: list[int], stop_ids: set[int], reply_prefix: str = "") -> str:
        """Append the reply ids as sampled; return the assistant message."""
        self.ids.extend(token_ids)
        reply_text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        content = reply_prefix + reply_body(self.tokenizer, token_ids, stop_ids)
        self.messages.append({"role": "assistant", "content": content})
        self.text += reply_text
        return content


def reply_body(tokenizer: Any, token_ids: list[int], stop_ids: set[int]) -> str:
    """A reply's text without its stop token."""
    body = token_ids[:-1] if token_ids and token_ids[-1] in stop_ids else token_ids
    return tokenizer.decode(body, skip_special_tokens=False)


def fresh_prompt(
    tokenizer: Any,
    messages: list[dict[str, str]],
    reply_prefix: str = "",
    images: Sequence[PromptImage] = (),
    encoder: ImageEncoder | None = None,
    tools: list[dict] | None = None,
) -> Prompt:
    """A whole prompt rendered from scratch, ending with ``reply_prefix`` (step rows)."""
    text = render(tokenizer, messages, generation_prompt=True, tools=tools) + reply_prefix
    return Prompt(tokenize(tokenizer, text, images, encoder), images)
