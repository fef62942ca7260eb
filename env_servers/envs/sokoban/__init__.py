"""Sokoban: procedurally generated levels (reverse play) played through `<answer>Direction</answer>` replies."""

from env_servers.envs.sokoban.env import ACTIONS, METRICS, SokobanConfig, SokobanEnv, cached_level
from env_servers.envs.sokoban.generator import Level, generate_level, render_board, solve
from env_servers.registry import register

register("sokoban", SokobanConfig)(SokobanEnv)

__all__ = [
    "ACTIONS",
    "METRICS",
    "Level",
    "SokobanConfig",
    "SokobanEnv",
    "cached_level",
    "generate_level",
    "render_board",
    "solve",
]
