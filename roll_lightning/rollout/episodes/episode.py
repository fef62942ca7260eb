"""One episode: reset with the group's seed, then render → generate → step until it ends.

`EpisodeBuilder` holds the bookkeeping (prompts, token ids, rewards) and does no I/O, so the async runner
(`run_episode`) and the lock-step collector drive the very same code. The runner parses nothing: the reply
text goes to the env as the action and the env judges it (an unparsable reply is a normal, penalised step).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from roll_lightning.env_client.session import EnvSession, ResetOutcome, StepOutcome
from roll_lightning.env_client.tools import ClientToolCall, ClientToolResult, tools_of
from roll_lightning.rollout.engines.base import Generates, Generation, SamplingParams
from roll_lightning.rollout.episodes.layout import Layout, layout_named
from roll_lightning.rollout.prompts.chat import PromptConfig, TokenHistory, fresh_prompt, reply_body
from roll_lightning.rollout.prompts.vision import ImageEncoder, ImageInputError, Prompt, PromptImage, images_of

LayoutName = Literal["trajectory", "step"]
EndReason = Literal["terminated", "truncated", "max_turns", "context"]


class ContextBudgetError(ValueError):
    """The first prompt alone does not fit the context budget: no turn could ever be played."""


class ToolHistoryError(ValueError):
    """Step rows without history for a tool env: the model would never see its calls' results."""


@dataclass
class Turn:
    """One reply and its consequence. ``prompt_ids``: trajectory rows: the ids added before this reply (the
    first turn: the whole first prompt); step rows: the whole prompt of this turn."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    observation: str  # what the agent saw when it replied (GiGPO's anchor state, unless ``anchor`` is set)
    images: tuple[PromptImage, ...] = ()  # the pictures of ``prompt_ids``, in order
    observation_images: tuple[PromptImage, ...] = ()  # the pictures of ``observation`` (what the agent saw)
    reply: str = ""  # the assistant message: the reply prefix (a prompt part, not sampled), then the reply
    reply_prefix: str = ""
    tool_calls: tuple[ClientToolCall, ...] = ()  # the calls parsed from the reply (tool envs only)
    tool_results: tuple[ClientToolResult, ...] = ()  # their results, shown to the next prompt as tool messages
    reward: float = 0.0
    action_valid: bool = True
    metrics: dict[str, float] = field(default_factory=dict)
    generate_s: float = 0.0
    env_s: float = 0.0
    redone: int = 0  # times a suspend aborted this turn's reply before it was asked again (on_suspend: abort)
    # on_suspend: keep: ``(token offset, version)`` where each piece of a reply several weights sampled begins
    versions: tuple[tuple[int, int], ...] = ()
    anchor: str = ""  # GiGPO's step state when it is not ``observation`` (an agent's call: its whole prompt, hashed)

    @property
    def state(self) -> str:
        """The state GiGPO groups this turn's step by."""
        return self.anchor or self.observation


@dataclass(frozen=True)
class BranchPoint:
    """Where a forked episode left the one it was copied from: the turns before ``turn`` are the other's (its
    rows train them), and their rewards count in this episode's return."""

    parent: str  # the traj_key of the episode it was forked from
    turn: int  # the first turn this episode played itself
    prefix_return: float  # the rewards of the turns before it


@dataclass
class Episode:
    """A finished episode with everything a training row needs."""

    group_index: int
    member: int
    seed: int
    env_id: str
    episode_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    end_reason: EndReason = "terminated"
    attempts: int = 1
    wall_s: float = 0.0
    final_observation: str = ""  # what the env showed after the last move (the hole, the goal, the solved board)
    reset_s: float = 0.0  # how long the env's reset took, as the trainer saw it
    tag: str = ""  # the env's tag in a multi-env run (rollout.envs); "" = the env id
    image_encode_s: float = 0.0  # time the model's image processor took over this episode's pictures
    final_images: tuple[PromptImage, ...] = ()  # the pictures of ``final_observation``
    replies_judged: bool = True  # False: an agent's calls, which no env judges (no invalid-reply rate)
    refused_calls: int = 0  # an agent's calls the endpoint refused (not recorded, so not trained)
    branch: BranchPoint | None = None  # set when forked from another member mid-episode (data.rollout.branch)

    @property
    def group_key(self) -> str:
        return f"{self.tag or self.env_id}/g{self.group_index}/s{self.seed}"

    @property
    def traj_key(self) -> str:
        return f"{self.group_key}/m{self.member}"

    @property
    def score(self) -> float:
        """The episode's return: a forked episode's counts the turns before its fork too."""
        return (self.branch.prefix_return if self.branch else 0.0) + sum(t.reward for t in self.turns)

    @property
    def first_turn(self) -> int:
        """The index of ``turns[0]`` in the whole episode (a forked episode's start after another's turns)."""
        return self.branch.turn if self.branch else 0

    @property
    def policy_version(self) -> int:
        """The oldest weights that wrote any of its replies (what staleness is measured against)."""
        return min((t.policy_version for t in self.turns), default=0)

    def metrics(self) -> dict[str, float]:
        n = len(self.turns)
        last = self.turns[-1].metrics if self.turns else {}
        return {
            "success": float(last.get("success", 0.0)),
            "return": self.score,
            "turns": float(n),
            **(
                {"invalid_action_rate": sum(not t.action_valid for t in self.turns) / n if n else 0.0}
                if self.replies_judged
                else {}
            ),
            "response_tokens": float(sum(len(t.response_ids) for t in self.turns)),
            "truncated_replies": float(sum(t.finish_reason == "length" for t in self.turns)),
            "env_latency_s": sum(t.env_s for t in self.turns) / n if n else 0.0,
            "reset_latency_s": self.reset_s,
            "generate_latency_s": sum(t.generate_s for t in self.turns) / n if n else 0.0,
            "context_ended": float(self.end_reason == "context"),
            "attempts": float(self.attempts),
            "image_bytes": sum(len(i.data) for t in self.turns for i in t.observation_images) / n if n else 0.0,
            "image_encode_s": self.image_encode_s,
        }


@dataclass(frozen=True)
class EpisodeSettings:
    layout: LayoutName = "trajectory"
    max_turns: int = 10
    max_context_tokens: int = 2048
    sampling: SamplingParams = SamplingParams()
    prompt: PromptConfig = PromptConfig()

    @property
    def row_layout(self) -> Layout:
        """The `layout.Layout` that ``layout`` names: what each turn's prompt is, and the rows an episode makes."""
        return layout_named(self.layout)


class EpisodeBuilder:
    """Pure bookkeeping for one episode (no awaits, no env or engine calls)."""

    def __init__(
        self,
        tokenizer: Any,
        settings: EpisodeSettings,
        spec: Any,
        episode: Episode,
        stop_ids: set[int],
        vision: ImageEncoder | None = None,
    ) -> None:
        """``vision``: the policy's image encoder (None: a text-only policy, which refuses pictures)."""
        self.tokenizer, self.settings, self.spec, self.episode = tokenizer, settings, spec, episode
        self.layout = settings.row_layout
        self.stop_ids = stop_ids
        self.vision = vision
        self.tools = tools_of(spec) if spec is not None and getattr(spec, "tools", None) else []
        self.history = TokenHistory(tokenizer, encoder=vision, tools=self.tools or None)
        self.observation = ""
        self.observation_images: tuple[PromptImage, ...] = ()
        self.calls: tuple[ClientToolCall, ...] = ()  # the last reply's calls, for the env's step
        if self.tools and self.layout.one_row_per_turn and settings.prompt.history_turns == 0:
            raise ToolHistoryError(
                f"env '{episode.env_id}' has tools, but step rows with history_turns 0 never show the model its "
                "calls' results: set prompt.history_turns >= 1, or use layout trajectory"
            )
        self.done = False
        self._pending_prompt: list[int] = []
        self.past: list[Turn] = []  # a forked episode's turns before its fork (another episode's rows)
        self.fork_anchor = ""  # the next turn's GiGPO state when the episode forks there (`fork`)
        self._carry: tuple[list[int], tuple[PromptImage, ...]] | None = None  # a fork's conversation so far
        if settings.prompt.system_prompt:
            self.history.messages.append({"role": "system", "content": settings.prompt.system_prompt})
            self.history.text = ""  # the system message is rendered together with the first user message

    @property
    def turns(self) -> list[Turn]:
        """Every turn played so far, a fork's earlier turns included."""
        return [*self.past, *self.episode.turns] if self.past else self.episode.turns

    @property
    def turn(self) -> int:
        """The index of the next turn."""
        return len(self.past) + len(self.episode.turns)

    def fork(self, episode: Episode) -> EpisodeBuilder:
        """This episode's bookkeeping copied for ``episode``, which continues it from here on a forked session;
        the turns so far stay this episode's. Both record their next turn under one GiGPO state (``fork_anchor``),
        which `data.rollout.branch` makes exact: both steps start from the same env state."""
        copy = object.__new__(EpisodeBuilder)
        copy.__dict__.update(self.__dict__)
        copy.episode, copy.history, copy.past = episode, self.history.copy(), self.turns
        copy.calls, copy._pending_prompt = (), []
        if not self.layout.one_row_per_turn:  # its one row starts with the whole conversation so far, as prompt
            copy._carry = (list(self.history.ids), tuple(self.history.images))
        self.fork_anchor = copy.fork_anchor = f"fork {self.episode.traj_key}#{self.episode.attempts}@{self.turn}"
        return copy

    @property
    def max_turns(self) -> int:
        spec_max = int(getattr(self.spec, "max_steps", 0) or 0)
        return min(self.settings.max_turns, spec_max) if spec_max else self.settings.max_turns

    def user_message(self, turn: int, observation: str) -> str:
        p = self.settings.prompt
        example = getattr(self.spec, "example_action", "")
        template = p.turn_template
        if not example:  # an env that gives no example move: no "e.g." followed by nothing
            template = template.replace(", e.g. {example_action}", "")
        text = template.format(
            turn=turn + 1,
            observation=observation,
            actions_left=self.max_turns - turn,
            action_format=getattr(self.spec, "action_format", ""),
            example_action=example,
            max_new_tokens=self.settings.sampling.max_new_tokens,
        )
        instruction = getattr(self.spec, "instruction", "")
        if turn == 0 and p.instruction_first_turn and instruction:
            text = f"{instruction}\n\n{text}"
        return text

    def start(self, reset: ResetOutcome, reset_s: float = 0.0) -> None:
        self.episode.episode_id, self.episode.reset_s = reset.episode_id, reset_s
        self.observation = reset.observation
        self.observation_images = self._pictures(reset)

    def _pictures(self, outcome: ResetOutcome | StepOutcome) -> tuple[PromptImage, ...]:
        images = getattr(outcome, "images", ())
        if not images:
            return ()
        if self.vision is None:
            raise ImageInputError(
                f"env '{self.episode.env_id}' sends images, but the model has no image processor "
                "(preprocessor_config.json): use a vision-language model, or ask the env for text observations"
            )
        started = time.perf_counter()
        pictures = tuple(self.vision.encode(image) for image in images)
        self.episode.image_encode_s += time.perf_counter() - started
        return pictures

    def window_images(self, turn: int) -> tuple[PromptImage, ...]:
        """The pictures of `window_messages`, in order: the past turns it shows, then the current one."""
        first = max(0, turn - self.settings.prompt.history_turns)
        past = [image for t in self.turns[first:turn] for image in t.observation_images]
        return (*past, *self.observation_images)

    def next_request(self) -> tuple[list[int], SamplingParams] | None:
        """The prompt ids and sampling params of the next reply, or None when the episode is over."""
        if self.done:
            return None
        turn = self.turn
        if turn >= self.max_turns:
            self._end("max_turns")
            return None
        self._pending_prompt, prompt = self.layout.next_prompt(self, turn)
        context = len(prompt)
        room = self.settings.max_context_tokens - context
        if room < 1:
            if turn == 0:
                raise ContextBudgetError(
                    f"max_context_tokens={self.settings.max_context_tokens} is smaller than the first prompt "
                    f"({context} tokens) of env '{self.episode.env_id}': raise it or shorten the prompt"
                )
            self._end("context")
            return None
        params = self.settings.sampling
        if room < params.max_new_tokens:
            params = params.replace(max_new_tokens=room)
        return prompt, params

    def window_messages(self, turn: int) -> list[dict[str, str]]:
        messages = [m for m in self.history.messages if m["role"] == "system"]
        first = max(0, turn - self.settings.prompt.history_turns)
        turns = self.turns
        for past in range(first, turn):
            t = turns[past]
            messages.append({"role": "user", "content": self.user_message(past, t.observation)})
            messages.append({"role": "assistant", "content": t.reply})
            messages += tool_messages(t)
        messages.append({"role": "user", "content": self.user_message(turn, self.observation)})
        return messages

    def grown_prompt(self, turn: int) -> tuple[list[int], Prompt]:
        """The conversation grown by this turn's messages: ``(the ids added, the whole conversation)``; the ids
        of earlier turns are kept, never re-rendered."""
        prefix = self.settings.prompt.reply_prefix
        added = self.history.add_messages(self.turn_messages(turn), prefix, self.observation_images)
        return added, Prompt(self.history.ids, self.history.images)

    def window_prompt(self, turn: int) -> Prompt:
        """A fresh prompt: the system message, a window of ``history_turns`` past turns, the observation."""
        return fresh_prompt(
            self.tokenizer, self.window_messages(turn), self.settings.prompt.reply_prefix,
            self.window_images(turn), self.vision, self.tools or None,
        )  # fmt: skip

    def kept_reply(self, token_ids: list[int]) -> str:
        """The reply text, added to the growing conversation's ids as they were generated."""
        return self.history.add_reply(token_ids, self.stop_ids, self.settings.prompt.reply_prefix)

    def fresh_reply(self, token_ids: list[int]) -> str:
        """The reply text (prefix, then the reply without its stop token), for prompts rendered afresh."""
        return self.settings.prompt.reply_prefix + reply_body(self.tokenizer, token_ids, self.stop_ids)

    def turn_messages(self, turn: int) -> list[dict[str, str]]:
        """What a growing conversation adds before turn ``turn``'s reply: the last calls' results, then the
        observation."""
        last = tool_messages(self.turns[turn - 1]) if turn else []
        return [*last, {"role": "user", "content": self.user_message(turn, self.observation)}]

    def record_reply(self, generation: Generation, generate_s: float) -> str:
        """Store the reply; return the action text for the env: the reply prefix and the reply's text."""
        reply = self.layout.reply_text(self, list(generation.token_ids))
        action = self.settings.prompt.reply_prefix + self.tokenizer.decode(
            generation.token_ids, skip_special_tokens=True
        )
        calls = self.settings.prompt.reply_parser.parse(action) if self.tools else []
        turn = self.turn
        self.calls = tuple(ClientToolCall(f"call_{turn}_{k}", c.name, c.arguments) for k, c in enumerate(calls))
        prompt_ids, images = self._pending_prompt, images_of(self._pending_prompt)
        if self._carry is not None:  # a fork's first turn: its row's prompt is the whole conversation so far
            prompt_ids, images = self._carry[0] + list(prompt_ids), self._carry[1] + images
            self._carry = None
        anchor, self.fork_anchor = self.fork_anchor, ""
        self.episode.turns.append(
            Turn(
                prompt_ids=prompt_ids,
                response_ids=list(generation.token_ids),
                logprobs=list(generation.logprobs),
                finish_reason=generation.finish_reason,
                policy_version=generation.policy_version,
                observation=self.observation,
                anchor=anchor,
                images=images,
                observation_images=self.observation_images,
                reply=reply,
                reply_prefix=self.settings.prompt.reply_prefix,
                generate_s=generate_s,
                redone=int(generation.extra.get("redone", 0)),
                versions=tuple((int(at), int(v)) for at, v in generation.extra.get("versions", ())),
                tool_calls=self.calls,
            )
        )
        return action

    def record_step(self, outcome: StepOutcome, env_s: float) -> None:
        turn = self.episode.turns[-1]
        turn.reward, turn.action_valid, turn.env_s = outcome.reward, outcome.action_valid, env_s
        turn.tool_results = outcome.tool_results
        turn.metrics = dict(outcome.metrics)
        self.observation = self.episode.final_observation = outcome.observation
        self.observation_images = self.episode.final_images = self._pictures(outcome)
        if outcome.terminated:
            self._end("terminated")
        elif outcome.truncated:
            self._end("truncated")

    def _end(self, reason: EndReason) -> None:
        self.done = True
        self.episode.end_reason = reason


BeforeTurn = Callable[[EnvSession, EpisodeBuilder], Awaitable[None]]


async def run_episode(
    session: EnvSession,
    engine: Generates,
    builder: EpisodeBuilder,
    *,
    turn_timeout_s: float | None = None,
    before_turn: BeforeTurn | None = None,
) -> Episode:
    """Play one episode to its end. Env faults raise `EpisodeFailed`; a turn past its deadline raises
    `TimeoutError` (the scheduler retries or drops the group; nothing partial is returned). The env is stepped
    once per turn, with the whole reply ``engine.generate`` returned (a reply aborted by a suspend never is).
    A forked episode (``builder.past``) continues where its fork left off, without a reset. ``before_turn``
    runs before each turn's prompt is made (where a branching rollout forks)."""
    started = time.perf_counter()
    episode = builder.episode
    if not builder.past:
        reset = await session.reset(seed=episode.seed)
        builder.start(reset, time.perf_counter() - started)
    while True:
        if before_turn is not None and not builder.done:
            await before_turn(session, builder)
        request = builder.next_request()
        if request is None:
            break
        prompt, params = request
        t0 = time.perf_counter()
        async with asyncio.timeout(turn_timeout_s):
            generation = await engine.generate(prompt, params, key=episode.traj_key)
        t1 = time.perf_counter()
        action = builder.record_reply(generation, t1 - t0)
        outcome = await session.step(action, builder.calls)
        builder.record_step(outcome, time.perf_counter() - t1)
    episode.wall_s = time.perf_counter() - started
    return episode


def tool_messages(turn: Turn) -> list[dict[str, str]]:
    """A turn's tool results as the chat template's ``tool`` messages, in call order."""
    return [
        {"role": "tool", "content": r.content, "name": r.name, "tool_call_id": r.call_id} for r in turn.tool_results
    ]
