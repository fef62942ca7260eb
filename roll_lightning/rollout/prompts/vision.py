"""Images in prompts: each ``<image>`` marker becomes its picture's vision-token run (as a Qwen2-VL processor
makes it), the pixel values carried beside the ids, so prompt ids stay appended.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from roll_lightning.rollout.prompts.encoding import encode

IMAGE_MARKER = "<image>"
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")


class ImageInputError(ValueError):
    """A text-only model given pictures, or markers that do not match them."""


class EncodedImage(Protocol):
    """A picture as the env sent it."""

    data: bytes
    media_type: str


@dataclass(frozen=True, eq=False)
class PromptImage:
    """One picture ready for the model: the env's bytes and the image processor's output."""

    data: bytes
    media_type: str
    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    tokens: int  # patches over the merge area
    token_id: int  # ``<|image_pad|>``


class Prompt(list[int]):
    """Token ids carrying their pictures through whatever passes prompts along."""

    images: tuple[PromptImage, ...]

    def __init__(self, ids: Iterable[int] = (), images: Sequence[PromptImage] = ()) -> None:
        super().__init__(ids)
        self.images = tuple(images)


def images_of(prompt: Sequence[int]) -> tuple[PromptImage, ...]:
    """The pictures a prompt carries."""
    return getattr(prompt, "images", ())


class ImageEncoder:
    """A vision-language model's image processor and vision token ids; encodings are cached by bytes (~0.3-1 ms
    each on the rollout loop)."""

    def __init__(self, processor: Any, tokenizer: Any, cache_size: int = 256) -> None:
        self.processor = processor
        self.cache: OrderedDict[bytes, PromptImage] = OrderedDict()
        self.cache_size = cache_size
        self.merge_area = int(getattr(processor, "merge_size", 2)) ** 2
        ids = [tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS]
        if any(i is None or i == tokenizer.unk_token_id for i in ids):
            raise ImageInputError(f"the tokenizer lacks the vision tokens {', '.join(VISION_TOKENS)}")
        self.start_id, self.image_id, self.end_id = ids

    @classmethod
    def load(cls, folder: str | Path, tokenizer: Any) -> ImageEncoder | None:
        """The encoder of a model folder; None for a text-only model."""
        if not (Path(folder) / "preprocessor_config.json").is_file():
            return None
        from transformers import AutoImageProcessor

        return cls(AutoImageProcessor.from_pretrained(str(folder)), tokenizer)

    def encode(self, image: EncodedImage) -> PromptImage:
        """The picture ready for the model (cached: never modify it)."""
        known = self.cache.get(image.data)
        if known is not None and known.media_type == image.media_type:
            self.cache.move_to_end(image.data)
            return known
        encoded = self._encode(image)
        self.cache[image.data] = encoded
        if len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return encoded

    def _encode(self, image: EncodedImage) -> PromptImage:
        from PIL import Image

        try:
            picture = Image.open(io.BytesIO(image.data)).convert("RGB")
        except Exception as err:
            raise ImageInputError(f"an observation image ({image.media_type}) does not decode: {err}") from err
        out = self.processor(images=[picture], return_tensors="pt")
        t, h, w = (int(x) for x in out["image_grid_thw"][0])
        tokens = t * h * w // self.merge_area
        return PromptImage(image.data, image.media_type, out["pixel_values"], (t, h, w), tokens, self.image_id)

    def placeholder(self, image: PromptImage) -> list[int]:
        return [self.start_id, *[self.image_id] * image.tokens, self.end_id]


def tokenize(tokenizer: Any, text: str, images: Sequence[PromptImage], encoder: ImageEncoder | None) -> list[int]:
    """``text``'s ids, each ``<image>`` marker replaced by its vision-token run."""
    if not images:  # a literal marker is just text
        return encode(tokenizer, text)
    pieces = text.split(IMAGE_MARKER)
    if len(pieces) - 1 != len(images) or encoder is None:
        raise ImageInputError(f"the prompt holds {len(pieces) - 1} {IMAGE_MARKER} markers for {len(images)} images")
    ids = encode(tokenizer, pieces[0])
    for image, piece in zip(images, pieces[1:], strict=True):
        ids += encoder.placeholder(image) + encode(tokenizer, piece)
    return ids


def model_inputs(input_ids: torch.Tensor, rows: Sequence[Sequence[PromptImage]], image_token_id: int) -> dict[str, Any]:
    """A Qwen2-VL model's keyword arguments for the rows' pictures."""
    images = [image for row in rows for image in row]
    if not images:
        return {}
    device = input_ids.device
    return {
        "pixel_values": torch.cat([image.pixel_values for image in images]).to(device),
        "image_grid_thw": torch.tensor([image.grid_thw for image in images], dtype=torch.long, device=device),
        "mm_token_type_ids": (input_ids == image_token_id).int(),
    }


def vision_token_ids(config: Any) -> tuple[int, ...]:
    """The ids a vision-language model reserves for pictures; replies never sample them."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    ids = {getattr(config, name, None) for name in names} if getattr(config, "vision_config", None) else set()
    return tuple(sorted(i for i in ids if isinstance(i, int)))


def collapsed(prompt: Sequence[int]) -> list[int]:
    """Each placeholder run cut to one, for processors that expand them (vLLM's)."""
    images = images_of(prompt)
    if not images:
        return list(prompt)
    pad = images[0].token_id
    return [t for i, t in enumerate(prompt) if t != pad or i == 0 or prompt[i - 1] != pad]
