"""Sokoban levels by gym-sokoban's reverse play (solvable by construction), the text board, and an optimal solver.

Cells are row-major indices ``row * width + col``; the outer ring is always wall, so ``cell + delta`` of a floor
cell never leaves the grid.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

import numpy as np

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"

# Floor stamps along the random walk: bars, two elbows and a 2x2 block.
_STAMPS = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
)
_WALK_DIRS = ((-1, 0), (1, 0), (0, -1), (0, 1))
_DIRECTION_CHANGE_P = 0.35


@dataclass(frozen=True)
class Level:
    """An immutable Sokoban level."""

    height: int
    width: int
    floor: bytes  # one byte per cell, 1 = floor, 0 = wall
    targets: tuple[int, ...]  # sorted cell indices
    boxes: tuple[int, ...]  # sorted cell indices
    player: int
    score: int = 0  # box swaps x displacement; 0 for hand-made levels

    def render(self) -> str:
        return render_board(
            self.height, self.width, self.floor, frozenset(self.targets), frozenset(self.boxes), self.player
        )

    @classmethod
    def from_text(cls, text: str) -> Level:
        """Parse a board in the render format (``#_OX√PS``)."""
        rows = [row for row in text.strip().split("\n")]
        height, width = len(rows), len(rows[0]) if rows else 0
        if height < 3 or width < 3 or any(len(row) != width for row in rows):
            raise ValueError("level text must be a rectangle of at least 3x3 cells")
        floor, targets, boxes, players = bytearray(height * width), [], [], []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                cell = r * width + c
                if ch not in (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET):
                    raise ValueError(f"unknown symbol {ch!r} at row {r}, column {c}")
                if ch == WALL:
                    continue
                if r in (0, height - 1) or c in (0, width - 1):
                    raise ValueError(f"the outer ring must be wall; found {ch!r} at row {r}, column {c}")
                floor[cell] = 1
                if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.append(cell)
                if ch in (BOX, BOX_ON_TARGET):
                    boxes.append(cell)
                if ch in (PLAYER, PLAYER_ON_TARGET):
                    players.append(cell)
        if len(players) != 1:
            raise ValueError(f"a level needs exactly one player, found {len(players)}")
        if not boxes or len(boxes) != len(targets):
            raise ValueError(
                f"a level needs as many targets as boxes (>= 1), found {len(boxes)} boxes, {len(targets)} targets"
            )
        return cls(height, width, bytes(floor), tuple(sorted(targets)), tuple(sorted(boxes)), players[0])


def render_board(
    height: int, width: int, floor: bytes, targets: frozenset[int], boxes: frozenset[int] | set[int], player: int
) -> str:
    """The RAGEN/ROLL text board: one symbol per cell, one line per row."""
    chars = []
    for cell in range(height * width):
        on_target = cell in targets
        if not floor[cell]:
            chars.append(WALL)
        elif cell == player:
            chars.append(PLAYER_ON_TARGET if on_target else PLAYER)
        elif cell in boxes:
            chars.append(BOX_ON_TARGET if on_target else BOX)
        else:
            chars.append(TARGET if on_target else FLOOR)
    return "\n".join("".join(chars[r * width : (r + 1) * width]) for r in range(height))


def attempt_rng(seed: int, attempt: int) -> random.Random:
    """The RNG of one generation attempt; SeedSequence mixes (seed, attempt) without `hash()`."""
    state = np.random.SeedSequence([seed, attempt]).generate_state(2, dtype=np.uint64)
    return random.Random(int(state[0]) << 64 | int(state[1]))


def generate_level(
    dim_room: tuple[int, int],
    num_boxes: int,
    seed: int,
    *,
    search_budget: int = 2000,
    search_depth: int = 300,
    player_walk: int = 3,
    max_attempts: int = 64,
) -> Level:
    """A solvable level; the same arguments give the same level in any process.

    Args:
        dim_room: (height, width) including the wall ring.
        num_boxes: boxes (= targets) to place.
        seed: non-negative; attempt ``k`` draws from ``SeedSequence([seed, k])``.
        search_budget: distinct box arrangements to expand per attempt.
        search_depth: longest reverse play, in player moves (gym-sokoban's TTL).
        player_walk: random free steps (1..N, 0 = off) so the player does not start at the last pulled box.
        max_attempts: attempts before RuntimeError.
    """
    height, width = dim_room
    if seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed}")
    for attempt in range(max_attempts):
        rng = attempt_rng(seed, attempt)
        floor = _carve_room(height, width, rng)
        cells = [i for i, f in enumerate(floor) if f]
        if len(cells) < num_boxes + 1:
            continue
        player, *targets = rng.sample(cells, num_boxes + 1)
        found = _reverse_play(height, width, floor, tuple(targets), player, search_budget, search_depth)
        if found is None:
            continue
        score, boxes, player = found
        if player_walk > 0:
            player = _random_walk(width, floor, set(boxes), player, rng.randint(1, player_walk), rng)
        return Level(height, width, floor, tuple(sorted(targets)), tuple(sorted(boxes)), player, score)
    raise RuntimeError(
        f"could not generate a {height}x{width} Sokoban level with {num_boxes} boxes from seed {seed} "
        f"in {max_attempts} attempts; use fewer boxes or a larger room"
    )


def _carve_room(height: int, width: int, rng: random.Random) -> bytes:
    floor = bytearray(height * width)
    r, c = rng.randrange(1, height - 1), rng.randrange(1, width - 1)
    dr, dc = rng.choice(_WALK_DIRS)
    for _ in range(int(1.7 * (height + width))):
        if rng.random() < _DIRECTION_CHANGE_P:
            dr, dc = rng.choice(_WALK_DIRS)
        r, c = min(max(r + dr, 1), height - 2), min(max(c + dc, 1), width - 2)
        for sr, sc in rng.choice(_STAMPS):
            rr, cc = r + sr, c + sc
            if 0 < rr < height - 1 and 0 < cc < width - 1:  # the outer ring stays wall
                floor[rr * width + cc] = 1
    return bytes(floor)


def _reverse_play(
    height: int, width: int, floor: bytes, targets: tuple[int, ...], player: int, budget: int, max_depth: int
) -> tuple[int, tuple[int, ...], int] | None:
    """DFS over pull moves from the solved state: the best (score, boxes by id, player), None if score 0.

    One node is one box arrangement (player walking is a flood fill), not one player step as in gym-sokoban.
    """
    rows = [i // width for i in range(height * width)]
    cols = [i % width for i in range(height * width)]
    deltas = (-width, width, -1, 1)
    best: tuple[int, tuple[int, ...], int] | None = None
    best_score = 0
    expanded: set[tuple[int, int]] = set()
    pushed: set[tuple[int, int]] = set()
    # node: (boxes by box id, player, last pulled box id, box swaps, displacement, player moves so far)
    stack = [(targets, player, -1, 0, 0, 0)]
    while stack and len(expanded) < budget:
        boxes, player, last, swaps, disp, depth = stack.pop()
        box_id = {b: i for i, b in enumerate(boxes)}
        # Flood fill: walking cost to each cell the player can reach.
        dist = {player: 0}
        queue = deque((player,))
        while queue:
            p = queue.popleft()
            d = dist[p] + 1
            for delta in deltas:
                q = p + delta
                if floor[q] and q not in dist and q not in box_id:
                    dist[q] = d
                    queue.append(q)
        mask = 0
        for b in boxes:
            mask |= 1 << b
        key = (min(dist), mask)
        if key in expanded:
            continue
        expanded.add(key)
        for p, d in dist.items():
            for delta in deltas:
                b, q = p - delta, p + delta  # pull the box at b onto p while stepping to q
                if b not in box_id or not floor[q] or q in box_id or depth + d + 1 > max_depth:
                    continue
                i = box_id[b]
                child_mask = mask ^ (1 << b) ^ (1 << p)
                if (q, child_mask) in pushed:
                    continue
                pushed.add((q, child_mask))
                t = targets[i]
                child_disp = (
                    disp
                    - abs(rows[b] - rows[t])
                    - abs(cols[b] - cols[t])
                    + abs(rows[p] - rows[t])
                    + abs(cols[p] - cols[t])
                )
                child_swaps = swaps + (i != last)
                child_boxes = boxes[:i] + (p,) + boxes[i + 1 :]
                score = child_swaps * child_disp
                if score > best_score:
                    best_score, best = score, (score, child_boxes, q)
                stack.append((child_boxes, q, i, child_swaps, child_disp, depth + d + 1))
    return best


def _random_walk(width: int, floor: bytes, boxes: set[int], player: int, steps: int, rng: random.Random) -> int:
    deltas = (-width, width, -1, 1)
    for _ in range(steps):
        free = [player + d for d in deltas if floor[player + d] and player + d not in boxes]
        if free:
            player = rng.choice(free)
    return player


def solve(level: Level, max_nodes: int = 1_000_000) -> int | None:
    """Optimal number of moves to solve ``level`` (BFS pruning dead squares), or None past ``max_nodes`` states."""
    width, floor = level.width, level.floor
    deltas = (-width, width, -1, 1)
    live = _live_cells(level)
    goal = sum(1 << t for t in level.targets)
    start = (level.player, sum(1 << b for b in level.boxes))
    if start[1] == goal:
        return 0
    seen = {start}
    frontier = [start]
    moves = 0
    while frontier and len(seen) < max_nodes:
        moves += 1
        nxt = []
        for player, mask in frontier:
            for delta in deltas:
                q = player + delta
                if not floor[q]:
                    continue
                child_mask = mask
                if mask >> q & 1:
                    r = q + delta
                    if not live[r] or mask >> r & 1:
                        continue
                    child_mask = mask ^ (1 << q) ^ (1 << r)
                    if child_mask == goal:
                        return moves
                state = (q, child_mask)
                if state not in seen:
                    seen.add(state)
                    nxt.append(state)
        frontier = nxt
    return None


def _live_cells(level: Level) -> bytearray:
    """Cells from which a lone box can still be pushed to some target."""
    width, floor = level.width, level.floor
    live = bytearray(len(floor))
    stack = list(level.targets)
    for t in stack:
        live[t] = 1
    while stack:
        x = stack.pop()
        for delta in (-width, width, -1, 1):
            prev = x - delta  # box came from prev, pushed by a player standing at prev - delta
            if floor[prev] and floor[prev - delta] and not live[prev]:
                live[prev] = 1
                stack.append(prev)
    return live
