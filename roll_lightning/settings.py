"""What every setting shares: one error type that names the YAML key, and the values a choice allows."""

from __future__ import annotations

from typing import Any, get_args, get_type_hints


class ConfigError(ValueError):
    """A setting that cannot work; the message names its key (``data.rollout.mode must be one of ...``)."""


def choices(config: object, key: str) -> tuple[Any, ...]:
    """The values a ``Literal``-typed setting allows, read from its type: each choice is declared once."""
    return get_args(get_type_hints(type(config))[key])


def one_of(config: object, key: str) -> str:
    """The rule a choice breaks, as its error message says it: ``one of a, b, c``."""
    return "one of " + ", ".join(map(str, choices(config, key)))
