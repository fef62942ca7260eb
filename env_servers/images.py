"""The image rules of protocol v1 (env.proto's header, "Images") and a small deterministic PNG writer.

The server runtime refuses to send an observation that breaks a rule (`image_rule_broken` names the rule), and
the conformance suite checks what any server sends with the same function. `encode_png` lets an env draw its
state without an imaging library: the same pixels always give the same bytes.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

from env_servers.api import IMAGE_MARKER

MAX_IMAGES = 8  # per observation
MAX_IMAGE_BYTES = 2 * 1024 * 1024  # encoded data of one image
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}  # media type -> leading bytes


def image_rule_broken(text: str, images: Sequence[Any]) -> str | None:
    """The first image rule that an observation breaks, in words naming it; None when it keeps them all.

    ``images``: anything with ``data`` and ``media_type`` (`env_servers.api.Image` or the protobuf `Image`).
    """
    if len(images) > MAX_IMAGES:
        return f"{len(images)} images: at most {MAX_IMAGES} per observation"
    markers = text.count(IMAGE_MARKER)
    if markers != len(images):
        return f"the text holds {markers} {IMAGE_MARKER} markers for {len(images)} images: one marker per image"
    for k, image in enumerate(images):
        magic = MAGIC.get(image.media_type)
        if magic is None:
            return f"image {k}: media_type {image.media_type!r}: must be one of {', '.join(MAGIC)}"
        if not isinstance(image.data, bytes):
            return f"image {k}: data is {type(image.data).__name__}, not bytes"
        if len(image.data) > MAX_IMAGE_BYTES:
            return f"image {k}: {len(image.data)} bytes of data: at most {MAX_IMAGE_BYTES} (2 MiB) per image"
        if not image.data.startswith(magic):
            return f"image {k}: data does not start with the {image.media_type} magic bytes {magic!r}"
    return None


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``width`` x ``height`` pixels (``rgb``: 3 bytes per pixel, row by row).

    Deterministic: no timestamps or text chunks, and zlib at a fixed level, so the same pixels give the same bytes.
    """
    if width < 1 or height < 1 or len(rgb) != 3 * width * height:
        raise ValueError(f"encode_png: {len(rgb)} bytes for {width}x{height} RGB pixels (want {3 * width * height})")
    stride = 3 * width
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))  # filter 0 on each row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit, truecolour, no interlace
    return MAGIC["image/png"] + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


__all__ = ["MAGIC", "MAX_IMAGES", "MAX_IMAGE_BYTES", "encode_png", "image_rule_broken"]
