"""Env ids -> env classes. Built-in envs register themselves when `env_servers.envs` is imported."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from env_servers.api import EnvSpec, TextEnv, parse_config


@dataclass(frozen=True)
class EnvEntry:
    env_id: str
    env_cls: type
    config_cls: type

    def make_config(self, values: Mapping[str, Any] | None) -> Any:
        return parse_config(self.config_cls, values, env_id=self.env_id)

    def describe(self, config: Any) -> EnvSpec:
        return self.env_cls.describe(config)

    def make(self, config: Any) -> TextEnv:
        return self.env_cls(config)


_REGISTRY: dict[str, EnvEntry] = {}
_BUILTINS_LOADED = False


def register(env_id: str, config_cls: type) -> Callable[[type], type]:
    """Class decorator: ``@register("sokoban", SokobanConfig)``."""

    def wrap(env_cls: type) -> type:
        if env_id in _REGISTRY and _REGISTRY[env_id].env_cls is not env_cls:
            raise ValueError(f"env id '{env_id}' is already registered to {_REGISTRY[env_id].env_cls.__name__}")
        _REGISTRY[env_id] = EnvEntry(env_id, env_cls, config_cls)
        return env_cls

    return wrap


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        importlib.import_module("env_servers.envs")
        _BUILTINS_LOADED = True


def get_env(env_id: str) -> EnvEntry:
    """The entry for ``env_id``; ``KeyError`` naming the known ids otherwise."""
    _load_builtins()
    try:
        return _REGISTRY[env_id]
    except KeyError:
        raise KeyError(f"unknown env id '{env_id}' (known: {', '.join(sorted(_REGISTRY))})") from None


def known_env_ids() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)
