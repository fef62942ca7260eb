"""A tiny random Qwen2-VL chat model, built offline in seconds: `tiny` for images.

One vision token per 28-pixel square, so a board with the envs' default ``cell_pixels`` gives one per cell.
``vocab="words"`` serves the from-pixels recipe.

CLI: ``python -m roll_lightning.models.tiny_vl OUT_DIR [--seed N] [--vocab words] ...``
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from roll_lightning.models import tiny

VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
# Qwen2-VL's own sizes
PATCH_SIZE, MERGE_SIZE = 14, 2
# bump when the recipe changes, to invalidate cached builds
RECIPE_VERSION = 2


def build_tiny_vl_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    vision_dim: int = 32,
    vision_depth: int = 1,
    vocab: str = "bpe",
    max_image_tokens: int = 256,
    rope_theta: float = 10.0,
) -> Path:
    """Build a random Qwen2-VL model, tokenizer and image processor into ``out_dir`` (byte-identical for equal
    arguments). ``max_image_tokens`` bounds an image's vision tokens.

    ``rope_theta`` 10, with most M-RoPE frequencies on rows and columns, lets a random model tell cells apart;
    Qwen2-VL's 1e6 does not (docs/benchmarks.md, "Learning from pixels").
    """
    head_dim, rest = divmod(hidden_size, num_heads)
    if rest or head_dim % 8:
        raise ValueError(f"hidden_size/num_heads must be a multiple of 8, got {hidden_size}/{num_heads}")
    if vocab not in tiny.VOCABS:
        raise ValueError(f"vocab must be one of {tiny.VOCABS}, got {vocab!r}")
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = tiny.build_tokenizer() if vocab == "bpe" else tiny.build_word_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", *VISION_TOKENS]})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in [*tiny.SPECIAL_TOKENS, *VISION_TOKENS]}
    half = head_dim // 2  # M-RoPE splits a head's rotary frequencies into (time, height, width) sections
    side = (half - half // 8) // 2
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=-(-len(tokenizer) // 64) * 64 if vocab == "bpe" else len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=4 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            rope_scaling={"type": "mrope", "mrope_section": [half - 2 * side, side, side]},
            rope_theta=rope_theta,
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|pad|>"],
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            depth=vision_depth,
            embed_dim=vision_dim,
            hidden_size=hidden_size,
            num_heads=2,
            mlp_ratio=2,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=2,
            in_chans=3,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|image_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|pad|>"]
    )
    square = PATCH_SIZE * MERGE_SIZE
    processor = Qwen2VLImageProcessorPil(min_pixels=square * square, max_pixels=square * square * max_image_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    processor.save_pretrained(out)
    model.save_pretrained(out)
    return out


def tiny_vl_model(cache_dir: str | Path, seed: int = 0, **kwargs: Any) -> Path:
    """`build_tiny_vl_model` once per argument set, cached under ``cache_dir``."""
    name = tiny.cache_name(f"tiny-vl-v{RECIPE_VERSION}", seed, kwargs)
    return tiny.cached_build(Path(cache_dir) / name, lambda tmp: build_tiny_vl_model(tmp, seed=seed, **kwargs))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build a tiny random Qwen2-VL chat model (offline).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--num-heads", type=int, default=2)
    ap.add_argument("--vision-dim", type=int, default=32)
    ap.add_argument("--vision-depth", type=int, default=1)
    ap.add_argument("--vocab", default="bpe", choices=tiny.VOCABS)
    args = vars(ap.parse_args(argv))
    print(build_tiny_vl_model(args.pop("out_dir"), **args))


if __name__ == "__main__":
    main()
