"""What the agent endpoint records of one episode: its calls, in segments of one growing conversation whose
reply ids stay as sampled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from roll_lightning.rollout.prompts.chat import TemplateDriftError, TokenHistory


@dataclass(frozen=True)
class AgentCall:
    """One chat call as the engine saw and sampled it."""

    segment: int
    prompt_ids: list[int]
    reply_ids: list[int]
    logprobs: list[float]
    policy_version: int
    finish_reason: str
    shown: str = ""  # what the call showed the model since its last reply, as text (the viewer's observation)
    reply: str = ""  # the reply's text as returned
    versions: tuple[tuple[int, int], ...] = ()  # on_suspend: keep: where the weights changed under the reply


@dataclass
class Segment:
    """One growing conversation: its tokens and its `normalised` messages."""

    history: TokenHistory
    seen: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Plan:
    """A call's prompt before it is answered; `AgentEpisode.record` keeps it."""

    segment: int
    history: TokenHistory
    seen: list[dict[str, Any]]

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.history.ids)


@dataclass
class AgentEpisode:
    key: str
    calls: list[AgentCall] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    finished: bool = False
    reward: float | None = None  # None: not reported yet
    metrics: dict[str, float] = field(default_factory=dict)
    refused: int = 0  # calls answered with an error, not recorded
    error: str | None = None  # why the agent gave the episode up (`POST .../failed`), if it did
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set when the reward or an error is reported

    def plan(self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None) -> Plan:
        """The last segment extended when ``messages`` extend it, else a new segment."""
        wanted = [normalised(m) for m in messages]
        if self.segments and _extends(self.segments[-1], wanted, tools):
            current = self.segments[-1]
            history = current.history.copy()
            try:
                history.add_messages([_as_template_message(m) for m in messages[len(current.seen) :]])
                return Plan(len(self.segments) - 1, history, wanted)
            except TemplateDriftError:
                pass  # the template re-renders old turns: start over
        history = TokenHistory(tokenizer, tools=tools or None)
        history.add_messages([_as_template_message(m) for m in messages])
        return Plan(len(self.segments), history, wanted)

    def record(self, plan: Plan, call: AgentCall, stop_ids: set[int], returned: dict[str, Any]) -> None:
        """Commit a planned call and its reply ids as sampled."""
        plan.history.add_reply(call.reply_ids, stop_ids)
        segment = Segment(plan.history, [*plan.seen, normalised(returned)])
        if plan.segment < len(self.segments):
            self.segments[plan.segment] = segment
        else:
            self.segments.append(segment)
        self.calls.append(call)


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
    """What must match for two messages to be the same turn."""
    out: dict[str, Any] = {"role": message.get("role"), "content": text_of(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    if message.get("role") == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out


def since_last_reply(messages: list[dict[str, Any]]) -> str:
    """The messages after the conversation's last assistant turn (all of them for a first call), one
    ``[role] text`` block each: what the model was shown anew."""
    start = max((i + 1 for i, m in enumerate(messages) if m.get("role") == "assistant"), default=0)
    return "\n\n".join(f"[{m.get('role')}] {text_of(m.get('content'))}" for m in messages[start:])


def text_of(content: Any) -> str:
    """A message's content as text (a string, or its text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _as_template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A request message as chat templates take it (tool calls kept)."""
    out = {"role": message["role"], "content": text_of(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    if message["role"] == "tool":
        out["tool_call_id"] = message.get("tool_call_id", "")
    return out
