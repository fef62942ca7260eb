"""Sokoban's board as a picture, painted from the text board so both always show the same state."""

from __future__ import annotations

import numpy as np

from env_servers.envs.png import paint_cells, tile_sheet
from env_servers.envs.sokoban.generator import BOX, BOX_ON_TARGET, FLOOR, PLAYER, PLAYER_ON_TARGET, TARGET, WALL

_WALL_C, _FLOOR_C, _TARGET_C = (70, 70, 80), (225, 215, 190), (140, 210, 140)
BOX_COLOUR, BOX_ON_TARGET_COLOUR, PLAYER_COLOUR = (185, 115, 45), (40, 140, 60), (40, 90, 220)
_PICTURE = {  # symbol -> (ground, shape, fill, edge)
    WALL: (_WALL_C, "", (0, 0, 0), (0, 0, 0)),
    FLOOR: (_FLOOR_C, "", (0, 0, 0), (0, 0, 0)),
    TARGET: (_TARGET_C, "", (0, 0, 0), (0, 0, 0)),
    BOX: (_FLOOR_C, "square", BOX_COLOUR, (95, 55, 20)),
    BOX_ON_TARGET: (_TARGET_C, "square", BOX_ON_TARGET_COLOUR, (20, 70, 30)),
    PLAYER: (_FLOOR_C, "circle", PLAYER_COLOUR, (20, 40, 110)),
    PLAYER_ON_TARGET: (_TARGET_C, "circle", PLAYER_COLOUR, (20, 40, 110)),
}
_TILES = tuple(_PICTURE.values())
_TO_DIGIT = str.maketrans({symbol: str(i) for i, symbol in enumerate(_PICTURE)})


def paint(board: str, cell_pixels: int = 28) -> np.ndarray:
    """The text board (`render_board`'s symbols) as RGB ``[rows * cell_pixels, cols * cell_pixels, 3]``."""
    digits = board.replace("\n", "").translate(_TO_DIGIT).encode("ascii")
    kinds = (np.frombuffer(digits, dtype=np.uint8) - ord("0")).reshape(board.count("\n") + 1, -1)
    return paint_cells(kinds, tile_sheet(cell_pixels, _TILES))
