"""Env ids -> env classes. Built-in envs register themselves when `env_servers.envs` is imported."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from env_servers.api import EnvSpec, TextEnv, can_fork, parse_config


@dataclass(frozen=True)
class EnvEntry:
    env_id: str
    env_cls: type
    config_cls: type

    def make_config(self, values: Mapping[str, Any] | None) -> Any:
        return parse_config(self.config_cls, values, env_id=self.env_id)

    def describe(self, config: Any) -> EnvSpec:
        """The env's spec for ``config``, asked of the env once per process: a probe may start a game, a server or
        a connection, and both runtimes ask at every session."""
        key = (self.env_id, config)
        spec = _SPECS.get(key)
        if spec is None:
            if len(_SPECS) >= 1024:  # bound it: clients may send many configs
                _SPECS.clear()
            spec = _SPECS[key] = self.env_cls.describe(config)
        return spec

    def make(self, config: Any) -> TextEnv:
        return self.env_cls(config)

    @property
    def forkable(self) -> bool:
        """Its sessions can be forked (``EnvSpec.forkable``; `env_servers.api.can_fork`)."""
        return can_fork(self.env_cls)


_SPECS: dict[tuple[str, Any], EnvSpec] = {}  # (env id, config) -> spec
_REGISTRY: dict[str, EnvEntry] = {}
# id prefix -> factory(id) -> EnvEntry, for id families served by an adapter
_PREFIXES: dict[str, Callable[[str], EnvEntry]] = {}
_ADAPTER_MODULES = {
    "gem:": "env_servers.envs.gem_adapter",
    "gym:": "env_servers.envs.gym_adapter",
    "mcp:": "env_servers.envs.mcp_env",
    "openenv:": "env_servers.envs.openenv.adapter",
    "textarena:": "env_servers.envs.textarena_adapter",
}
_BUILTINS_LOADED = False


def register(env_id: str, config_cls: type) -> Callable[[type], type]:
    """Class decorator: ``@register("sokoban", SokobanConfig)``."""

    def wrap(env_cls: type) -> type:
        if env_id in _REGISTRY and _REGISTRY[env_id].env_cls is not env_cls:
            raise ValueError(f"env id '{env_id}' is already registered to {_REGISTRY[env_id].env_cls.__name__}")
        _REGISTRY[env_id] = EnvEntry(env_id, env_cls, config_cls)
        return env_cls

    return wrap


def register_prefix(prefix: str, factory: Callable[[str], EnvEntry]) -> None:
    """Serve every id starting with ``prefix`` through ``factory`` (e.g. ``gem:game:Sudoku-v0-easy``)."""
    _PREFIXES[prefix] = factory


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        importlib.import_module("env_servers.envs")
        _BUILTINS_LOADED = True


def get_env(env_id: str) -> EnvEntry:
    """The entry for ``env_id``; ``KeyError`` naming the known ids otherwise."""
    _load_builtins()
    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    for prefix, module in _ADAPTER_MODULES.items():
        if env_id.startswith(prefix) and prefix not in _PREFIXES:
            importlib.import_module(module)  # optional: imported on first use
    for prefix, factory in _PREFIXES.items():
        if env_id.startswith(prefix):
            _REGISTRY[env_id] = factory(env_id)
            return _REGISTRY[env_id]
    known = ", ".join([*sorted(_REGISTRY), *(f"{p}<id>" for p in sorted({*_PREFIXES, *_ADAPTER_MODULES}))])
    raise KeyError(f"unknown env id '{env_id}' (known: {known})")


def known_env_ids() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)
