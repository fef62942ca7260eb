"""What the agent endpoint records of one episode: every chat call as token ids, log-probs and policy version,
grouped into segments of one growing conversation.

A call whose messages extend the previous call's conversation (its messages, then the reply as returned, then
more messages) continues the segment: its prompt is the segment's tokens so far, the sampled reply ids among
them as they were sampled, plus the new messages rendered by the chat template. Any other call (an agent that
rewrote its history, dropped a turn or started over) starts a new segment, rendered from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from roll_lightning.rollout.chat import TemplateDriftError, TokenHistory


@dataclass(frozen=True)
class AgentCall:
    """One chat call: the whole prompt the engine saw, the reply it sampled, their log-probs and the version of
    the weights that sampled them."""

    segment: int
    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str


@dataclass
class Segment:
    """One growing conversation: its token history and the messages as the agent will send them back."""

    history: TokenHistory
    seen: list[dict[str, Any]] = field(default_factory=list)  # normalised request messages + returned replies


@dataclass(frozen=True)
class Plan:
    """A call's prompt before it is answered: the segment it extends (or a new one) as it would become. Nothing
    is recorded until `AgentEpisode.record`, so a call refused or lost leaves the episode as it was."""

    segment: int
    history: TokenHistory
    seen: list[dict[str, Any]]

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.history.ids)


@dataclass
class AgentEpisode:
    """An episode's calls, in order, and its segments."""

    key: str
    calls: list[AgentCall] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    finished: bool = False
    reward: float | None = None  # what the agent reported (None: not yet)
    metrics: dict[str, float] = field(default_factory=dict)

    def plan(self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None) -> Plan:
        """The prompt for ``messages``: the last segment extended when they extend it, else a new segment."""
        wanted = [normalised(m) for m in messages]
        if self.segments and _extends(self.segments[-1], wanted, tools):
            current = self.segments[-1]
            history = copy_history(current.history)
            try:
                history.add_messages([_as_template_message(m) for m in messages[len(current.seen) :]])
                return Plan(len(self.segments) - 1, history, wanted)
            except TemplateDriftError:
                pass  # the template renders the old turns differently now: start over
        history = TokenHistory(tokenizer, tools=tools or None)
        history.add_messages([_as_template_message(m) for m in messages])
        return Plan(len(self.segments), history, wanted)

    def record(self, plan: Plan, call: AgentCall, stop_ids: set[int], returned: dict[str, Any]) -> None:
        """Commit a call: its segment as planned, then its reply (ids exactly as sampled)."""
        plan.history.add_reply(call.reply_ids, stop_ids)
        segment = Segment(plan.history, [*plan.seen, normalised(returned)])
        if plan.segment < len(self.segments):
            self.segments[plan.segment] = segment
        else:
            self.segments.append(segment)
        self.calls.append(call)


def copy_history(history: TokenHistory) -> TokenHistory:
    return replace(history, messages=list(history.messages), ids=list(history.ids), images=list(history.images))


def _extends(segment: Segment, wanted: list[dict[str, Any]], tools: list[dict] | None) -> bool:
    seen = segment.seen
    new = wanted[len(seen) :]
    return (
        (segment.history.tools or None) == (tools or None)
        and len(wanted) > len(seen)
        and wanted[: len(seen)] == seen
        and all(m["role"] != "assistant" for m in new)
    )


def normalised(message: dict[str, Any]) -> dict[str, Any]:
    """What must be equal for two messages to be the same turn: role, text, tool calls (name and arguments) and
    the call a tool result answers."""
    out: dict[str, Any] = {"role": message.get("role"), "content": text_of(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _as_template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A request message as chat templates take it (text content; tool calls passed on for templates that render
    them, as Qwen2.5's does)."""
    out = {"role": message["role"], "content": text_of(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if message["role"] == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out
