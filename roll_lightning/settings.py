"""What every setting shares: one error type that names the YAML key, one way to state a constraint, and the
values a choice allows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin, get_type_hints

Rule = tuple[bool, str]  # (whether the value holds, what it must be: ">= 1", "one of a, b")


class ConfigError(ValueError):
    """A setting that cannot work; the message names its key (``data.rollout.mode must be one of ...``)."""


def choices(config: object, key: str) -> tuple[Any, ...]:
    """The values a ``Literal``-typed setting allows, read from its type (``None`` too if it is optional): each
    choice is declared once."""
    hint = get_type_hints(type(config))[key]
    if get_origin(hint) is Literal:
        return get_args(hint)
    return tuple(v for arg in get_args(hint) for v in (get_args(arg) if get_origin(arg) is Literal else (None,)))


def one_of(config: object, key: str) -> str:
    """The rule a choice breaks, as its error message says it: ``one of a, b, c``."""
    return "one of " + ", ".join(map(str, choices(config, key)))


def choice(config: object, key: str) -> Rule:
    """The rule of a ``Literal``-typed key: its value is one of the type's."""
    return getattr(config, key) in choices(config, key), one_of(config, key)


def check(
    section: str,
    config: object,
    rules: Mapping[str, Rule],
    error: type[ConfigError] = ConfigError,
    reasons: Mapping[str, str] | None = None,
) -> None:
    """Raise ``error`` for the first rule that does not hold: ``section.key must be <rule>, got <value>``, then
    ``: <reason>`` where one is given."""
    for key, (holds, rule) in rules.items():
        if not holds:
            reason = f": {reasons[key]}" if reasons and key in reasons else ""
            raise error(f"{section}.{key} must be {rule}, got {getattr(config, key)!r}{reason}")
