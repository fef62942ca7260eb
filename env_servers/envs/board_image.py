"""The grid envs' `render` modes: the board as text, as a picture, or both."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from env_servers.api import IMAGE_MARKER, ConfigError, Image, Observation
from env_servers.envs.png import encode_png

RENDER_MODES = ("text", "image", "both")
IMAGE_METRICS = ("image_bytes", "image_encode_s")
MIN_CELL_PIXELS = 4
RENDER_DOC = (
    "'text' (the symbol board), 'image' (the board as a PNG: the text holds <image> where the board was, "
    "words around the board are kept) or 'both' (the symbol board, a newline, then <image>)"
)
CELL_PIXELS_DOC = (
    "image side of one board cell in pixels (>= 4); 28 gives one vision token per cell in Qwen2-VL "
    "(14-pixel patches merged 2x2)"
)


def check_render(render: str, cell_pixels: int) -> None:
    """Raise ConfigError for a bad ``render`` or ``cell_pixels``."""
    if render not in RENDER_MODES:
        raise ConfigError(f"config.render={render!r} must be one of {', '.join(repr(m) for m in RENDER_MODES)}")
    if cell_pixels < MIN_CELL_PIXELS:
        raise ConfigError(f"config.cell_pixels={cell_pixels} must be >= {MIN_CELL_PIXELS}")


@dataclass(frozen=True)
class BoardView:
    """What replaces the board in an observation: ``text`` (the board, ``<image>``, or both) and its images."""

    text: str
    images: tuple[Image, ...] = ()
    metrics: dict[str, float] | None = None  # image_bytes, image_encode_s; None in text mode

    def observation(self, before: str = "", after: str = "") -> str | Observation:
        """The whole observation: a plain str in text mode, else an `Observation`."""
        text = f"{before}{self.text}{after}"
        return Observation(text, self.images) if self.images else text


def show_board(render: str, board: str, paint: Callable[[], np.ndarray]) -> BoardView:
    """The board in ``render`` mode; ``paint()`` is called only when pictured."""
    if render == "text":
        return BoardView(board)
    start = time.perf_counter()
    data = encode_png(paint())
    took = time.perf_counter() - start
    text = IMAGE_MARKER if render == "image" else f"{board}\n{IMAGE_MARKER}"
    return BoardView(text, (Image(data),), {"image_bytes": float(len(data)), "image_encode_s": took})


def legend(render: str, symbols: str, picture: str) -> str:
    """The instruction's key to the board, per ``render``."""
    if render == "text":
        return symbols
    return picture if render == "image" else f"{symbols}\n{picture}"
