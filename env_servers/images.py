"""The image rules of protocol v1 (env.proto's header, "Images"), shared by the server and the conformance suite."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from env_servers.api import IMAGE_MARKER

MAX_IMAGES = 8  # per observation
MAX_IMAGE_BYTES = 2 * 1024 * 1024  # encoded data of one image
MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


def image_rule_broken(text: str, images: Sequence[Any]) -> str | None:
    """The first image rule the observation breaks, in words; None if none.

    ``images``: anything with ``data`` and ``media_type`` (api or protobuf `Image`).
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


__all__ = ["MAGIC", "MAX_IMAGES", "MAX_IMAGE_BYTES", "image_rule_broken"]
