"""Several envs in one run (ROLL's env managers), each with a fixed share of every batch."""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from roll_lightning.rollout.agents.runner import AgentCommand
from roll_lightning.rollout.episodes.episode import EpisodeSettings
from roll_lightning.rollout.episodes.layout import LAYOUTS
from roll_lightning.rollout.errors import RolloutConfigError
from roll_lightning.settings import check

TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class EnvEntry:
    """One env of the run.

    Args:
        tag: its name in metrics, logs and checkpoints: letters, digits, ``_ . -``.
        env_id: the env as the servers register it (``python -m env_servers describe ID``).
        env_config: per-session env config, validated by the server.
        episode: ``rollout.episode`` overrides for this env (not ``layout``).
        endpoints: ``local`` or a list of ``host:port`` (None: ``data.envs.endpoints``).
        agent: your agent program plays the episodes (`agent_runner.AgentCommand`; step rows only).
    """

    tag: str
    env_id: str
    env_config: dict[str, Any] = field(default_factory=dict)
    episode: dict[str, Any] = field(default_factory=dict)
    endpoints: str | list[str] | None = None
    agent: dict[str, Any] | None = None


@dataclass(frozen=True)
class TrainEnv(EnvEntry):
    """A training env; ``groups``: its groups per batch (None everywhere: an even split)."""

    groups: int | None = None


@dataclass(frozen=True)
class EvalEnv(EnvEntry):
    """A held-out evaluation env; ``episodes``: starts played per evaluation (None: ``data.evaluation.episodes``)."""

    episodes: int | None = None


@dataclass(frozen=True)
class LaneSpec:
    """One resolved env of a run."""

    tag: str
    env_id: str
    env_config: dict[str, Any]
    groups: int
    episode: EpisodeSettings
    endpoints: str | tuple[str, ...] | None
    seed_salt: int | None  # None: the single-env form
    key: str  # the entry's config key, for messages
    agent: AgentCommand | None = None  # None: an env server plays it

    def endpoints_or(self, default: str | list[str]) -> str | tuple[str, ...]:
        value = self.endpoints if self.endpoints is not None else default
        return value if isinstance(value, str) else tuple(value)


def salt(tag: str) -> int:
    """A stable per-tag seed salt (Python's hash changes between processes)."""
    return zlib.crc32(tag.encode())


def resolve(
    entries: list[TrainEnv] | list[EvalEnv],
    shares: list[int],
    base: EpisodeSettings,
    key: str,
) -> tuple[LaneSpec, ...]:
    """Lanes for ``entries`` with ``shares`` groups each, checked."""
    seen: dict[str, int] = {}
    lanes = []
    for i, (entry, share) in enumerate(zip(entries, shares, strict=True)):
        where = f"{key}[{i}]"
        if not isinstance(entry.tag, str) or not TAG.match(entry.tag):
            raise RolloutConfigError(
                f"{where}.tag={entry.tag!r}: a tag is a metric and folder name: letters, digits, '_', '.', '-'"
            )
        if entry.tag in seen:
            raise RolloutConfigError(f"{where}.tag={entry.tag!r} is also {key}[{seen[entry.tag]}]'s: tags are unique")
        seen[entry.tag] = i
        if not entry.env_id:
            raise RolloutConfigError(f"{where}.env_id is empty: name the env this entry plays")
        settings = override(base, entry.episode, f"{where}.episode")
        if settings.layout != base.layout:
            raise RolloutConfigError(
                f"{where}.episode.layout={settings.layout!r} differs from data.rollout.episode.layout={base.layout!r}: "
                "a run trains one row layout (trajectory or step rows), so set it once, in data.rollout.episode"
            )
        check_episode(settings, f"{where}.episode")
        endpoints = entry.endpoints
        if endpoints is not None and not isinstance(endpoints, str):
            if not endpoints:
                raise RolloutConfigError(f"{where}.endpoints is an empty list: give 'local' or host:port addresses")
            endpoints = tuple(endpoints)
        if isinstance(endpoints, str) and endpoints != "local":
            endpoints = (endpoints,)
        for address in () if endpoints is None or endpoints == "local" else endpoints:
            host, _, port = address.rpartition(":")
            if not host or not port.isdigit():
                raise RolloutConfigError(f"{where}.endpoints: '{address}' is not host:port")
        agent = _agent(entry, settings, where)
        lanes.append(
            LaneSpec(
                entry.tag, entry.env_id, dict(entry.env_config), share, settings, endpoints, salt(entry.tag), where,
                agent,
            )
        )  # fmt: skip
    return tuple(lanes)


def _agent(entry: EnvEntry, settings: EpisodeSettings, where: str) -> AgentCommand | None:
    if entry.agent is None:
        return None
    if not isinstance(entry.agent, dict):
        raise RolloutConfigError(f"{where}.agent must be a mapping: {{command: [...], deadline_s, ...}}")
    if settings.layout != "step":
        raise RolloutConfigError(
            f"{where}.agent: an agent's calls train as step rows: set data.rollout.episode.layout: step"
        )
    if entry.endpoints is not None:
        raise RolloutConfigError(f"{where}.endpoints: an agent entry has no env servers")
    try:
        return AgentCommand(**{**entry.agent, "command": tuple(entry.agent.get("command") or ())})
    except (TypeError, ValueError) as err:
        raise RolloutConfigError(f"{where}.agent: {err}") from err


def check_episode(settings: EpisodeSettings, key: str) -> None:
    """What every lane's episode settings must satisfy."""
    rules = {
        "layout": (settings.layout in LAYOUTS, "one of " + ", ".join(LAYOUTS)),
        "max_turns": (settings.max_turns >= 1, ">= 1"),
    }
    check(key, settings, rules, RolloutConfigError)
    if settings.max_context_tokens <= settings.sampling.max_new_tokens:
        raise RolloutConfigError(
            f"{key}.max_context_tokens={settings.max_context_tokens} leaves no room for a prompt next to "
            f"{key}.sampling.max_new_tokens={settings.sampling.max_new_tokens}: one turn must fit"
        )


def override(settings: Any, patch: dict[str, Any], key: str) -> Any:
    """``settings`` with ``patch``'s keys replaced, dataclasses merged key by key."""
    if not isinstance(patch, dict):
        raise RolloutConfigError(f"{key} must be a mapping of keys to override, got {patch!r}")
    names = {f.name for f in fields(settings)}
    changes: dict[str, Any] = {}
    for name, value in patch.items():
        if name not in names:
            raise RolloutConfigError(f"{key}.{name}: no such key (keys: {', '.join(sorted(names))})")
        current = getattr(settings, name)
        if is_dataclass(current) and isinstance(value, dict):
            changes[name] = override(current, value, f"{key}.{name}")
        else:
            changes[name] = value
    try:
        return replace(settings, **changes)
    except (TypeError, ValueError) as err:
        raise RolloutConfigError(f"{key}: {err}") from err


def split_evenly(total: int, n: int, key: str) -> list[int]:
    """``total`` groups split equally over ``n`` envs."""
    if total % n:
        raise RolloutConfigError(
            f"{key}: {total} groups per batch do not split evenly over {n} envs; give each entry its 'groups' "
            f"(they must sum to {total})"
        )
    return [total // n] * n
