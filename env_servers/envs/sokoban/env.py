"""The Sokoban env: config, push rules and gym-sokoban rewards; levels come from `generator.generate_level`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from env_servers.api import EnvSpec, Observation
from env_servers.envs.answer import first_action_word, parse_actions
from env_servers.envs.board_image import CELL_PIXELS_DOC, IMAGE_METRICS, RENDER_DOC, check_render, legend, show_board
from env_servers.envs.sokoban.generator import Level, generate_level, render_board
from env_servers.envs.sokoban.picture import paint

ACTIONS = ("Up", "Down", "Left", "Right")
_VOCABULARY = {name.lower(): i for i, name in enumerate(ACTIONS)}
METRICS = ("action_valid", "action_effective", "boxes_on_target", "success")
MAX_ROOM_SIDE = 32


@dataclass(frozen=True)
class SokobanConfig:
    dim_room: tuple[int, int] = field(default=(6, 6), metadata={"doc": "room (height, width), wall ring included"})
    num_boxes: int = field(default=1, metadata={"doc": "boxes (= targets) per level"})
    max_steps: int = field(
        default=100, metadata={"doc": "turns before the episode is truncated; invalid replies count"}
    )
    search_budget: int = field(
        default=2000, metadata={"doc": "reverse-play nodes (box arrangements) searched per generation attempt"}
    )
    search_depth: int = field(
        default=300, metadata={"doc": "longest reverse play in player moves (gym-sokoban/RAGEN search_depth)"}
    )
    player_walk: int = field(
        default=3, metadata={"doc": "after generation the player walks 1..N random free steps (0 = off)"}
    )
    max_actions_per_turn: int = field(
        default=1, metadata={"doc": "most actions per reply, separated by '||' (RAGEN multi-action)"}
    )
    step_penalty: float = field(
        default=-0.1, metadata={"doc": "reward per action, also for blocked moves and invalid replies"}
    )
    box_reward: float = field(default=1.0, metadata={"doc": "+ when a box lands on a target, - when it leaves one"})
    solve_reward: float = field(default=10.0, metadata={"doc": "bonus when every box is on a target"})
    distance_reward: float = field(
        default=0.0,
        metadata={
            "doc": "shaping: + per cell a push brings a box closer to its nearest target (Manhattan), - per cell "
            "away; potential-based (Ng et al. 1999), so it sums to the distance gained over an episode (0 = off)"
        },
    )
    format_penalty: float = field(
        default=-0.1, metadata={"doc": "added to the step penalty when the reply has no valid <answer>"}
    )
    lenient: bool = field(
        default=False,
        metadata={"doc": "accept the first action word anywhere in the reply, no <answer> tag (tiny models; one move)"},
    )
    outer_wall: bool = field(
        default=True,
        metadata={"doc": "draw the outer ring of wall that every level has (false: only the inside, e.g. 4x4 of 6x6)"},
    )

    approach_reward: float = field(
        default=0.0,
        metadata={
            "doc": "shaping: + per cell a move brings the player closer to the nearest box off target (Manhattan), "
            "- per cell away; potential-based like distance_reward (0 = off)"
        },
    )
    render: str = field(default="text", metadata={"doc": RENDER_DOC})
    cell_pixels: int = field(default=28, metadata={"doc": CELL_PIXELS_DOC})

    def __post_init__(self) -> None:
        if len(self.dim_room) != 2:
            raise ValueError(f"dim_room={self.dim_room} must be (height, width)")
        height, width = self.dim_room
        if not (4 <= height <= MAX_ROOM_SIDE and 4 <= width <= MAX_ROOM_SIDE):
            raise ValueError(f"dim_room={self.dim_room} must have both sides in [4, {MAX_ROOM_SIDE}]")
        if self.num_boxes < 1:
            raise ValueError(f"num_boxes={self.num_boxes} must be >= 1")
        # Room to move: boxes + player at most half the interior.
        if self.num_boxes + 1 > (height - 2) * (width - 2) // 2:
            raise ValueError(f"num_boxes={self.num_boxes} does not fit in dim_room {self.dim_room}")
        for name in ("max_steps", "search_budget", "search_depth", "max_actions_per_turn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.lenient and self.max_actions_per_turn > 1:
            raise ValueError(
                "lenient=true takes one move per reply (the first action word): set max_actions_per_turn: 1"
            )
        if self.player_walk < 0:
            raise ValueError(f"player_walk={self.player_walk} must be >= 0")
        for name in ("step_penalty", "format_penalty"):
            if getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be <= 0")
        for name in ("box_reward", "solve_reward", "distance_reward", "approach_reward"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        check_render(self.render, self.cell_pixels)


def cached_level(config: SokobanConfig, seed: int) -> Level:
    """`generate_level` for ``config``, memoised: a GRPO group resets many sessions with one seed."""
    return _cached_generate(
        config.dim_room, config.num_boxes, seed, config.search_budget, config.search_depth, config.player_walk
    )


# Keyed on generation parameters only, so configs differing in rewards share levels.
@functools.lru_cache(maxsize=4096)
def _cached_generate(
    dim_room: tuple[int, int], num_boxes: int, seed: int, search_budget: int, search_depth: int, player_walk: int
) -> Level:
    return generate_level(
        dim_room, num_boxes, seed, search_budget=search_budget, search_depth=search_depth, player_walk=player_walk
    )


class SokobanEnv:
    """One Sokoban session."""

    forkable = True  # plain state: a deep copy continues the episode exactly

    def __init__(self, config: SokobanConfig) -> None:
        self.config = config
        self._level: Level | None = None
        self._deltas: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._targets: frozenset[int] = frozenset()
        self._boxes: set[int] = set()
        self._player = 0
        self._steps = 0
        self._done = True  # step() before reset() is refused

    def reset(self, seed: int, options: Mapping[str, Any] | None = None) -> tuple[str | Observation, dict[str, Any]]:
        """Start an episode. ``options["level"]`` (board text) plays a given level instead of generating one."""
        text = (options or {}).get("level")
        level = Level.from_text(text) if text is not None else cached_level(self.config, seed)
        self._level = level
        self._deltas = (-level.width, level.width, -1, 1)  # same order as ACTIONS
        self._targets = frozenset(level.targets)
        self._boxes = set(level.boxes)
        self._player = level.player
        self._steps = 0
        self._done = False
        info = {
            "seed": seed,
            "num_boxes": len(level.boxes),
            "boxes_on_target": self._on_target(),
            "level_score": level.score,
        }
        obs, image_metrics = self._observe()
        return obs, {**info, **(image_metrics or {})}

    def step(self, action: str) -> tuple[str | Observation, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        cfg = self.config
        self._steps += 1
        moves = (
            first_action_word(action, _VOCABULARY)
            if cfg.lenient
            else parse_actions(action, _VOCABULARY, cfg.max_actions_per_turn)
        )
        reward, effective = 0.0, False
        if moves is None:
            reward = cfg.step_penalty + cfg.format_penalty
        for move in moves or ():
            step_reward, changed = self._move(move)
            reward += step_reward
            effective |= changed
            if self._solved():
                reward += cfg.solve_reward
                break
        terminated = self._solved()
        truncated = not terminated and self._steps >= cfg.max_steps
        self._done = terminated or truncated
        on_target = self._on_target()
        obs, image_metrics = self._observe()
        info = {
            "action_valid": moves is not None,
            "boxes_on_target": on_target,
            "metrics": {
                "action_valid": float(moves is not None),
                "action_effective": float(effective),
                "boxes_on_target": float(on_target),
                "success": float(terminated),
                **(image_metrics or {}),
            },
        }
        return obs, reward, terminated, truncated, info

    def _move(self, move: int) -> tuple[float, bool]:
        """Apply one move: (reward, whether the board changed)."""
        cfg = self.config
        if not cfg.approach_reward:
            return self._push_or_walk(move)
        before = self._to_box()
        reward, changed = self._push_or_walk(move)
        return reward + cfg.approach_reward * (before - self._to_box()), changed

    def _push_or_walk(self, move: int) -> tuple[float, bool]:
        level, cfg = self._level, self.config
        delta = self._deltas[move]
        target = self._player + delta
        if not level.floor[target]:
            return cfg.step_penalty, False
        reward = cfg.step_penalty
        if target in self._boxes:
            beyond = target + delta
            if not level.floor[beyond] or beyond in self._boxes:
                return cfg.step_penalty, False
            self._boxes.remove(target)
            self._boxes.add(beyond)
            # Target-to-target pushes net zero, as in gym-sokoban (it rewards the change in boxes on target).
            reward += cfg.box_reward * ((beyond in self._targets) - (target in self._targets))
            if cfg.distance_reward:
                reward += cfg.distance_reward * (self._to_target(target) - self._to_target(beyond))
        self._player = target
        return reward, True

    def _to_box(self) -> int:
        """Manhattan distance from the player to the nearest box off target (0 if none)."""
        width, player = self._level.width, self._player
        loose = self._boxes - self._targets
        return min((abs(player // width - b // width) + abs(player % width - b % width) for b in loose), default=0)

    def _to_target(self, cell: int) -> int:
        """Manhattan distance from ``cell`` to the nearest target (walls ignored)."""
        width = self._level.width
        return min(abs(cell // width - t // width) + abs(cell % width - t % width) for t in self._targets)

    def _on_target(self) -> int:
        return len(self._boxes & self._targets)

    def _solved(self) -> bool:
        return self._boxes == self._targets

    def _render(self) -> str:
        level = self._level
        board = render_board(level.height, level.width, level.floor, self._targets, self._boxes, self._player)
        if self.config.outer_wall:
            return board
        return "\n".join(row[1:-1] for row in board.split("\n")[1:-1])

    def _observe(self) -> tuple[str | Observation, dict[str, float] | None]:
        """The observation per ``render`` and the picture's metrics (None in text mode)."""
        board = self._render()
        view = show_board(self.config.render, board, lambda: paint(board, self.config.cell_pixels))
        return view.observation(), view.metrics

    @classmethod
    def describe(cls, config: SokobanConfig) -> EnvSpec:
        n = config.max_actions_per_turn
        if config.lenient:
            action_format = "Direction (one of Up, Down, Left, Right)"
            answer = "Answer with a direction word, e.g. Left."
        else:
            action_format = (
                "<answer>Direction</answer> with Direction one of Up, Down, Left, Right"
                if n == 1
                else f"<answer>D1 || D2 || ...</answer> with 1 to {n} directions from Up, Down, Left, Right"
            )
            answer = f"Answer format: {action_format}, e.g. <answer>Left</answer>."
        instruction = (
            "You are playing Sokoban. Push every box onto a target. You can push a box one cell by walking into it "
            "if the cell beyond it is free; you cannot pull boxes or push two at once, and walls block you.\n"
            + legend(
                config.render,
                "Symbols: # wall, _ empty floor, O target, X box, √ box on target, P you, S you standing on a target.",
                "Picture: one square per cell; dark grey wall, beige floor, light green target; a brown square is a "
                "box, a dark green square a box on a target, the blue disc is you (on the cell you stand on).",
            )
            + "\n"
            f"Actions: Up, Down, Left, Right. Rewards: {config.step_penalty} per move, "
            f"{config.box_reward:+} when a box reaches a target, {-config.box_reward:+} when it leaves one, "
            f"{config.solve_reward:+} when all boxes are placed"
            + (
                f", {config.distance_reward:+} per cell a push brings a box closer to a target (- if farther).\n"
                if config.distance_reward
                else ".\n"
            )
            + (
                f"Shaping: {config.approach_reward:+} per cell you move closer to a box off target (- if farther).\n"
                if config.approach_reward
                else ""
            )
            + answer
            + (f" You may give up to {n} moves per turn separated by ||." if n > 1 else "")
        )
        k = min(n, config.num_boxes)
        gain = config.distance_reward + config.approach_reward + config.step_penalty  # a move may gain distance ...
        reward_max = config.solve_reward + max(min(j, k) * config.box_reward + j * gain for j in range(1, n + 1))
        push = config.box_reward + config.distance_reward + config.approach_reward  # ... or lose it
        reward_min = min(n * (config.step_penalty - push), config.step_penalty + config.format_penalty)
        return EnvSpec(
            env_id="sokoban",
            version="1",
            instruction=instruction,
            action_format=action_format,
            example_action="Left" if config.lenient else "<answer>Left</answer>",
            max_steps=config.max_steps,
            reward_min=reward_min,
            reward_max=reward_max,
            deterministic=True,
            splits={"train": 0, "test": 0},
            metrics=METRICS if config.render == "text" else METRICS + IMAGE_METRICS,
        )
