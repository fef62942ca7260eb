"""The FrozenLake env: a new map per reset seed (as RAGEN), Gymnasium's slip model, RAGEN's board symbols.

Maps use Gymnasium's letters (S, F, H, G) so tests can use Gymnasium's FrozenLake-v1 as a transition oracle.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from env_servers.api import EnvSpec, Observation
from env_servers.envs.answer import first_action_word, parse_actions
from env_servers.envs.board_image import CELL_PIXELS_DOC, IMAGE_METRICS, RENDER_DOC, check_render, legend, show_board
from env_servers.envs.png import paint_cells, tile_sheet
from env_servers.registry import register

ACTIONS = ("Left", "Down", "Right", "Up")  # Gymnasium's order
_VOCABULARY = {name.lower(): i for i, name in enumerate(ACTIONS)}
_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))
METRICS = ("action_valid", "action_effective", "success")
OBSERVATIONS = ("board", "board+words")
MAX_SIZE = 32
MAX_MAP_ATTEMPTS = 1000
# One tile per map letter, then the same four with the player on top.
_PICTURE_LETTERS = "FHGS"
_GROUNDS = {"F": (200, 230, 245), "H": (25, 45, 100), "G": (240, 190, 40), "S": (175, 215, 175)}
PLAYER_COLOUR, _PLAYER_EDGE = (215, 40, 40), (90, 15, 15)
_TILES = tuple((_GROUNDS[ch], "", (0, 0, 0), (0, 0, 0)) for ch in _PICTURE_LETTERS) + tuple(
    (_GROUNDS[ch], "circle", PLAYER_COLOUR, _PLAYER_EDGE) for ch in _PICTURE_LETTERS
)
_KIND = np.zeros(256, dtype=np.intp)
for _i, _ch in enumerate(_PICTURE_LETTERS):
    _KIND[ord(_ch)] = _i
# SeedSequence spawn keys: independent map and slip draws per seed.
_MAP_STREAM, _SLIP_STREAM = 0, 1


@dataclass(frozen=True)
class FrozenLakeConfig:
    size: int = field(default=4, metadata={"doc": "the map is size x size"})
    frozen_prob: float = field(default=0.8, metadata={"doc": "probability that a tile is frozen (else a hole)"})
    is_slippery: bool = field(
        default=False,
        metadata={"doc": "slip to a perpendicular direction; Gymnasium's default is True, ROLL's examples set False"},
    )
    success_rate: float = field(
        default=1 / 3,
        metadata={"doc": "slippery only: P(intended direction); each perpendicular gets (1 - success_rate) / 2"},
    )
    start_goal: str = field(
        default="random",
        metadata={"doc": "'random' (RAGEN: S and G at random distinct cells) or 'corners' (Gymnasium)"},
    )
    max_steps: int = field(
        default=100, metadata={"doc": "turns before the episode is truncated; invalid replies count"}
    )
    format_penalty: float = field(default=-0.01, metadata={"doc": "reward of a reply without a valid <answer>"})
    lenient: bool = field(
        default=False,
        metadata={"doc": "accept the first action word anywhere in the reply, no <answer> tag (tiny models)"},
    )
    observation: str = field(
        default="board",
        metadata={
            "doc": "'board' (RAGEN's grid) or 'board+words': the grid, then in words where the goal is from you "
            "and which moves fall into a hole (a small chat model reads words better than a grid)"
        },
    )
    render: str = field(default="text", metadata={"doc": RENDER_DOC})
    cell_pixels: int = field(default=28, metadata={"doc": CELL_PIXELS_DOC})

    def __post_init__(self) -> None:
        if not 2 <= self.size <= MAX_SIZE:
            raise ValueError(f"size={self.size} must be in [2, {MAX_SIZE}]")
        if not 0.0 < self.frozen_prob <= 1.0:
            raise ValueError(f"frozen_prob={self.frozen_prob} must be in (0, 1]")
        if not 0.0 <= self.success_rate <= 1.0:
            raise ValueError(f"success_rate={self.success_rate} must be in [0, 1]")
        if self.start_goal not in ("random", "corners"):
            raise ValueError(f"start_goal={self.start_goal!r} must be 'random' or 'corners'")
        if self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be >= 1")
        if self.format_penalty > 0:
            raise ValueError(f"format_penalty={self.format_penalty} must be <= 0")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"observation={self.observation!r} must be one of {', '.join(OBSERVATIONS)}")
        check_render(self.render, self.cell_pixels)


def generate_map(size: int, frozen_prob: float, seed: int, start_goal: str = "random") -> tuple[str, ...]:
    """A solvable map as rows of S/F/H/G; attempt ``k`` draws from ``SeedSequence(seed, spawn_key=(0, k))``."""
    for attempt in range(MAX_MAP_ATTEMPTS):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_MAP_STREAM, attempt)))
        grid = np.where(rng.random((size, size)) < frozen_prob, "F", "H")
        if start_goal == "corners":
            start, goal = 0, size * size - 1
        else:
            start, goal = (int(i) for i in rng.choice(size * size, 2, replace=False))
        grid.flat[start], grid.flat[goal] = "S", "G"
        desc = tuple("".join(row) for row in grid)
        if _has_path(desc):
            return desc
    raise RuntimeError(
        f"no solvable {size}x{size} FrozenLake map from seed {seed} in {MAX_MAP_ATTEMPTS} attempts; "
        f"raise frozen_prob={frozen_prob}"
    )


def _check_map(rows: Sequence[str]) -> tuple[str, ...]:
    desc = tuple(rows)
    if not desc or any(len(row) != len(desc) for row in desc) or any(ch not in "SFHG" for row in desc for ch in row):
        raise ValueError("map must be a square list of rows over the letters S, F, H, G")
    if sum(row.count("S") for row in desc) != 1 or sum(row.count("G") for row in desc) < 1:
        raise ValueError("map needs exactly one S and at least one G")
    return desc


def _has_path(desc: Sequence[str]) -> bool:
    size = len(desc)
    start = next((r, row.index("S")) for r, row in enumerate(desc) if "S" in row)
    seen, queue = {start}, deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return True
        for dr, dc in _MOVES:
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and desc[nr][nc] != "H":
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


def transitions(
    desc: Sequence[str], row: int, col: int, action: int, is_slippery: bool, success_rate: float = 1 / 3
) -> list[tuple[float, int, int]]:
    """Outcomes ``(prob, row, col)`` of ``action`` from (row, col), merged per cell (Gymnasium's model)."""
    if desc[row][col] in "HG":
        return [(1.0, row, col)]
    if is_slippery:
        side = (1.0 - success_rate) / 2
        choices = [((action - 1) % 4, side), (action, success_rate), ((action + 1) % 4, side)]
    else:
        choices = [(action, 1.0)]
    size = len(desc)
    merged: dict[tuple[int, int], float] = {}
    for direction, prob in choices:
        if prob <= 0:
            continue
        dr, dc = _MOVES[direction]
        cell = (min(max(row + dr, 0), size - 1), min(max(col + dc, 0), size - 1))
        merged[cell] = merged.get(cell, 0.0) + prob
    return [(prob, r, c) for (r, c), prob in merged.items()]


def render(desc: Sequence[str], row: int, col: int) -> str:
    """RAGEN's text board."""
    symbols = {"S": "_", "F": "_", "H": "O", "G": "G"}
    on = {"S": "P", "F": "P", "H": "X", "G": "√"}
    return "\n".join(
        "".join(on[ch] if (r, c) == (row, col) else symbols[ch] for c, ch in enumerate(line))
        for r, line in enumerate(desc)
    )


def describe_in_words(desc: Sequence[str], row: int, col: int) -> str:
    """Where the goal lies from (row, col) and which moves fall into a hole, in words."""
    size = len(desc)
    if desc[row][col] in "HG":
        return "You fell into a hole." if desc[row][col] == "H" else "You are on the goal."
    goal_row, goal_col = next((r, line.index("G")) for r, line in enumerate(desc) if "G" in line)
    rows, cols = goal_row - row, goal_col - col
    offsets = ((rows, "Down" if rows > 0 else "Up"), (cols, "Right" if cols > 0 else "Left"))
    goal = " and ".join(f"{abs(n)} {word}" for n, word in offsets if n)
    holes = [
        name
        for name, (dr, dc) in zip(ACTIONS, _MOVES, strict=True)
        if 0 <= row + dr < size and 0 <= col + dc < size and desc[row + dr][col + dc] == "H"
    ]
    danger = f"A hole is {' and '.join(holes)} of you." if holes else "No hole is next to you."
    return f"The goal is {goal} of you. {danger}"


def paint(desc: Sequence[str], row: int, col: int, cell_pixels: int = 28) -> np.ndarray:
    """The board as RGB ``[size * cell_pixels] * 2``, the same state as `render`."""
    kinds = _KIND[np.frombuffer("".join(desc).encode("ascii"), dtype=np.uint8)].reshape(len(desc), -1)
    kinds[row, col] += len(_PICTURE_LETTERS)
    return paint_cells(kinds, tile_sheet(cell_pixels, _TILES))


@register("frozenlake", FrozenLakeConfig)
class FrozenLakeEnv:
    """One FrozenLake session: reach G without falling into a hole."""

    forkable = True  # plain state and its own RNG (the slippery moves): a deep copy continues exactly

    def __init__(self, config: FrozenLakeConfig) -> None:
        self.config = config
        self._desc: tuple[str, ...] = ()
        self._pos = (0, 0)
        self._rng = np.random.default_rng(0)
        self._steps = 0
        self._done = True  # step() before reset() is refused

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str | Observation, dict[str, Any]]:
        """Start an episode on a map from ``seed`` (or ``options["map"]``: rows of S/F/H/G)."""
        cfg = self.config
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        given = (options or {}).get("map")
        self._desc = (
            _check_map(given) if given is not None else generate_map(cfg.size, cfg.frozen_prob, seed, cfg.start_goal)
        )
        self._pos = next((r, line.index("S")) for r, line in enumerate(self._desc) if "S" in line)
        self._rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SLIP_STREAM,)))
        self._steps = 0
        self._done = False
        obs, image_metrics = self._observe()
        return obs, {"seed": seed, "size": len(self._desc), **(image_metrics or {})}

    def step(self, action: str) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        cfg = self.config
        self._steps += 1
        moves = first_action_word(action, _VOCABULARY) if cfg.lenient else parse_actions(action, _VOCABULARY, 1)
        old = self._pos
        if moves is None:
            reward = cfg.format_penalty
        else:
            outcomes = transitions(self._desc, *old, moves[0], cfg.is_slippery, cfg.success_rate)
            pick = 0
            if len(outcomes) > 1:
                pick = int(self._rng.choice(len(outcomes), p=[p for p, _, _ in outcomes]))
            self._pos = outcomes[pick][1:]
            reward = 1.0 if self._cell() == "G" else 0.0
        terminated = self._cell() in "HG"
        truncated = not terminated and self._steps >= cfg.max_steps
        self._done = terminated or truncated
        success = self._cell() == "G"
        obs, image_metrics = self._observe()
        info = {
            "action_valid": moves is not None,
            "metrics": {
                "action_valid": float(moves is not None),
                "action_effective": float(self._pos != old),
                "success": float(success),
                **(image_metrics or {}),
            },
        }
        return obs, reward, terminated, truncated, info

    def _observe(self) -> tuple[str | Observation, dict[str, float] | None]:
        cfg = self.config
        view = show_board(cfg.render, render(self._desc, *self._pos), self._paint)
        words = "" if cfg.observation == "board" else f"\n{describe_in_words(self._desc, *self._pos)}"
        return view.observation(after=words), view.metrics

    def _paint(self) -> np.ndarray:
        return paint(self._desc, *self._pos, self.config.cell_pixels)

    def _cell(self) -> str:
        r, c = self._pos
        return self._desc[r][c]

    @classmethod
    def describe(cls, config: FrozenLakeConfig) -> EnvSpec:
        slip = (
            f" The ice is slippery: you move in the intended direction with probability {config.success_rate:.2f}, "
            "otherwise to one of the two perpendicular directions."
            if config.is_slippery
            else ""
        )
        if config.lenient:
            answer, action_format, example = (
                "Answer with a direction word, e.g. Left.",
                "Direction (one of Left, Down, Right, Up)",
                "Left",
            )
        else:
            answer, action_format, example = (
                "Answer format: <answer>Direction</answer>, e.g. <answer>Left</answer>.",
                "<answer>Direction</answer> with Direction one of Left, Down, Right, Up",
                "<answer>Left</answer>",
            )
        instruction = (
            "You are playing FrozenLake. Walk from your position to the goal G without stepping into a hole; "
            "falling into a hole ends the game. Walking off the edge leaves you in place."
            + slip
            + "\n"
            + legend(
                config.render,
                "Symbols: P you, _ frozen ice, O hole, G goal, X you in a hole, √ you on the goal.",
                "Picture: one square per cell; light blue ice, pale green the start (ice too), dark blue hole, "
                "gold goal; the red disc is you, on the tile you stand on.",
            )
            + "\n"
            "Actions: Left, Down, Right, Up. Reward 1 for reaching the goal, else 0.\n" + answer
        )
        return EnvSpec(
            env_id="frozenlake",
            version="1",
            instruction=instruction,
            action_format=action_format,
            example_action=example,
            max_steps=config.max_steps,
            reward_min=min(0.0, config.format_penalty),
            reward_max=1.0,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=METRICS if config.render == "text" else METRICS + IMAGE_METRICS,
        )
