"""A tiny random vision-language chat model (the Qwen2-VL architecture), built fully offline in seconds.

What `tiny` is for text, this is for images: a real Qwen2-VL folder (``config.json``, weights, tokenizer with the
vision tokens, ``preprocessor_config.json``) that transformers loads like ``Qwen/Qwen2-VL-2B-Instruct``, so tests
run the whole image path (the image processor, vision tokens in the prompt, M-RoPE, pixel values beside the rows)
without the hub. The vision encoder has patch 14 and a 2x2 merge: a 28-pixel square is one vision token, so a
board rendered with 28-pixel cells (the envs' ``cell_pixels`` default) gives one token per cell.

``vocab="words"`` uses `tiny`'s ~20-word vocabulary (each move is one token): the from-scratch pixel recipe,
``configs/frozenlake_pixels.yaml``.

CLI: ``python -m roll_lightning.models.tiny_vl OUT_DIR [--seed N] [--vocab words] ...``
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from roll_lightning.models import tiny

VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
# One vision token per 28-pixel square: patch 14, merged 2x2 (Qwen2-VL's own sizes).
PATCH_SIZE, MERGE_SIZE = 14, 2
# Bump when the recipe changes, so cached folders built by an older recipe are not reused.
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
    """Build a random ``Qwen2VLForConditionalGeneration``, its tokenizer and image processor into ``out_dir``.

    Same arguments give byte-identical files. ``max_image_tokens`` bounds an image's vision tokens (the image
    processor scales larger pictures down to fit). No dropout, so the trainer's log-probs equal the engine's.

    Positions: M-RoPE gives a vision token its row and column through two sections of each head's rotary
    frequencies. With Qwen2-VL's own ``rope_theta`` (1e6) and a 32-wide head those are the slowest frequencies,
    which turn by ~0.001 radians per cell: a random model cannot tell one cell from another, and a policy
    trained on that ignored the picture entirely. ``rope_theta`` 10 with most frequencies on the rows and
    columns turns them by 0.1-0.8 radians per cell.
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
    """`build_tiny_vl_model` once per argument set under ``cache_dir`` (built in a temp dir, renamed in place)."""
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
