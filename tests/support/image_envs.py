"""``pictures``: an env whose every observation carries images, for the image tests and bench/image_memory.py.

Registered on import (`serve pictures --import support.image_envs`, with tests/ on PYTHONPATH). Each observation
is ``"t=<step> <image>..."`` with ``images`` PNGs of a small board drawn from the seed and the step, so the same
seed gives the same bytes. ``broken`` names an image rule the observation at ``broken_at`` breaks (-1 = the
reset's, else that step's), for the refusal tests; any reply is a valid action. `NONCE[0] = True` (in-process
servers only) appends random bytes to every picture, for the conformance test of the determinism rule.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from env_servers import IMAGE_MARKER, EnvSpec, Image, Observation, register
from env_servers.envs.png import encode_png
from env_servers.images import MAX_IMAGE_BYTES, MAX_IMAGES

NONCE = [False]  # True: every picture also carries random bytes (a server whose images break determinism)
BROKEN = ("", "too-many", "markers", "media-type", "magic", "too-big", "not-bytes", "not-an-observation")


@dataclass(frozen=True)
class PicturesConfig:
    max_steps: int = 3
    images: int = 1  # per observation
    size: int = 8  # board side, in pixels
    broken: str = ""  # one of BROKEN
    broken_at: int = -1

    def __post_init__(self) -> None:
        if self.broken not in BROKEN:
            raise ValueError(f"broken={self.broken!r} must be one of {BROKEN}")


def board_png(seed: int, t: int, size: int) -> bytes:
    """A ``size`` x ``size`` picture of step ``t`` of episode ``seed``: random colours from the pair, one lit pixel."""
    rng = random.Random(seed * 1_000_003 + t)
    pixels = bytearray(rng.randrange(256) for _ in range(3 * size * size))
    pixels[3 * (t % (size * size)) : 3 * (t % (size * size)) + 3] = b"\xff\xff\xff"
    png = encode_png(np.frombuffer(bytes(pixels), dtype=np.uint8).reshape(size, size, 3))
    return png + os.urandom(4) if NONCE[0] else png


@register("pictures", PicturesConfig)
class PicturesEnv:
    def __init__(self, config: PicturesConfig) -> None:
        self.config = config
        self.seed, self.t = 0, 0

    @classmethod
    def describe(cls, config: PicturesConfig) -> EnvSpec:
        return EnvSpec("pictures", "1", "look", "any text", "go", config.max_steps, 0.0, 1.0, metrics=("t",))

    def reset(self, seed: int, options: Any = None) -> tuple[Any, dict[str, Any]]:
        self.seed, self.t = seed, 0
        return self._observation(-1), {"seed": seed}

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        done = self.t >= self.config.max_steps
        return self._observation(self.t - 1), float(done), done, False, {"metrics": {"t": self.t}}

    def _observation(self, at: int) -> Any:
        c = self.config
        images = [Image(board_png(self.seed, self.t * 16 + k, c.size)) for k in range(c.images)]
        broken = c.broken if at == c.broken_at else ""
        if broken == "too-many":
            images = images * (MAX_IMAGES + 1)
        elif broken == "media-type":
            images[0] = Image(images[0].data, "image/gif")
        elif broken == "magic":
            images[0] = Image(b"GIF89a" + images[0].data, "image/png")
        elif broken == "too-big":
            images[0] = Image(images[0].data + b"\x00" * MAX_IMAGE_BYTES)
        elif broken == "not-bytes":
            images[0] = Image(bytearray(images[0].data))  # type: ignore[arg-type]
        elif broken == "not-an-observation":
            return {"text": "t", "images": images}
        markers = len(images) + (1 if broken == "markers" else 0)
        return Observation(f"t={self.t} " + " ".join([IMAGE_MARKER] * markers), tuple(images))
