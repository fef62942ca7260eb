"""The offline tiny-model builder: determinism, shared tokenizer across seeds, chat template, loading, cache."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from roll_lightning.models import tiny  # noqa: E402
from roll_lightning.models.tiny import build_tiny_model, tiny_model  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SOKOBAN = "#######\n#_P√__#\n#_O_X_#\n#__S__#\n#######"
FROZENLAKE = "P_O\n___\n_O√"


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "a": build_tiny_model(root / "a", seed=0),
        "b": build_tiny_model(root / "b", seed=0),
        "c": build_tiny_model(root / "c", seed=1),
    }


def test_same_seed_gives_identical_bytes(built: dict[str, Path]) -> None:
    a, b = _files(built["a"]), _files(built["b"])
    assert {"config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES} <= set(a)
    assert a == b


def test_seeds_differ_in_weights_but_share_the_tokenizer(built: dict[str, Path]) -> None:
    a, c = _files(built["a"]), _files(built["c"])
    assert a["model.safetensors"] != c["model.safetensors"]
    for name in TOKENIZER_FILES:
        assert a[name] == c[name], name


def test_build_leaves_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_chat_template_and_special_tokens(built: dict[str, Path]) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built["a"])
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>" and tok.bos_token is None
    assert tok.eos_token_id != tok.pad_token_id
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": SOKOBAN}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert text == "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages) + (
        "<|im_start|>assistant\n"
    )
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns a BatchEncoding
    assert ids == tok.encode(text) and tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3  # special tokens stay single ids


@pytest.mark.parametrize(
    "text", [SOKOBAN, FROZENLAKE, "<think>Box left, so push.</think> <answer>Left || Up</answer>", "héllo ✓ 42"]
)
def test_encode_decode_round_trip(built: dict[str, Path], text: str) -> None:
    loaded = transformers.AutoTokenizer.from_pretrained(built["a"])
    ids = loaded.encode(text)
    assert loaded.decode(ids) == text
    # the folder must load as the tokenizer we trained (vLLM loads it the same way)
    assert ids == tiny.build_tokenizer().encode(text)


def test_model_loads_and_generates(built: dict[str, Path]) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(built["a"])
    model = transformers.AutoModelForCausalLM.from_pretrained(built["a"])
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size >= len(tok) and not model.config.tie_word_embeddings
    assert model.generation_config.eos_token_id == tok.eos_token_id
    prompt = tok(FROZENLAKE, return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert out.shape == (1, prompt["input_ids"].shape[1] + 6)


def test_cache_builds_once(tmp_path: Path, built: dict[str, Path]) -> None:
    first = tiny_model(tmp_path, seed=0)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert tiny_model(tmp_path, seed=0) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert _files(first) == _files(built["a"])
    assert tiny_model(tmp_path, seed=0, num_layers=1) != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind


def test_cache_survives_losing_a_race(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_build = tiny.build_tiny_model

    def build_while_another_process_wins(out_dir: Path, **kw: object) -> Path:
        real_build(out_dir, **kw)
        final = Path(tmp_path) / f"tiny-v{tiny.RECIPE_VERSION}-seed0"
        real_build(final, **kw)  # the other process renamed its copy into place first
        return out_dir

    monkeypatch.setattr(tiny, "build_tiny_model", build_while_another_process_wins)
    path = tiny_model(tmp_path, seed=0)
    assert (path / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_cli(tmp_path: Path, built: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    tiny.main([str(tmp_path / "m"), "--seed", "1"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    assert _files(tmp_path / "m") == _files(built["c"])


def test_rejects_head_sizes_vllm_cpu_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hidden_size/num_heads"):
        build_tiny_model(tmp_path, hidden_size=64, num_heads=4)  # head_dim 16


def test_word_vocabulary_model(tmp_path: Path) -> None:
    """The learning recipe's model: a ~20-token vocabulary, each action one token, exact round trips of the
    observation-only chat prompts, no logits for ids that decode to nothing, and AutoTokenizer loads it as saved."""
    path = build_tiny_model(tmp_path / "words", vocab="words")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert len(tok) == len(tiny.SPECIAL_TOKENS) + len(tiny.WORD_TOKENS) == model.config.vocab_size
    for action in ("Left", "Down", "Right", "Up"):
        assert len(tok.encode(action, add_special_tokens=False)) == 1
    board = "P__O\n_O__\n___G\n√X__"
    prompt = tok.apply_chat_template([{"role": "user", "content": board}], tokenize=False, add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    assert tok.decode(ids) == prompt and len(ids) == len(board) + 8  # one token per board character
    assert tok.convert_ids_to_tokens(ids[-3:]) == ["<|im_start|>", "assistant", "\n"]
    unknown = tok.encode("Upright!", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(unknown)[0] == "Up" and set(unknown[1:]) == {tok.unk_token_id}
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    with pytest.raises(ValueError, match="vocab"):
        build_tiny_model(tmp_path / "bad", vocab="chars")


def test_the_grid_model_runs_gpt2s_tanh_gelu_as_one_fused_op(tmp_path: Path) -> None:
    """The main command's model: the same outputs as GPT-2's ``gelu_new`` (one formula, written as separate ops),
    from the op that computes it in one kernel and one backward node."""
    path = build_tiny_model(tmp_path / "grid", vocab="words", positions="learned")
    fused = transformers.AutoModelForCausalLM.from_pretrained(path)
    composed = transformers.AutoModelForCausalLM.from_pretrained(path, activation_function="gelu_new")
    assert fused.config.activation_function == "gelu_pytorch_tanh"
    ids = torch.randint(0, fused.config.vocab_size, (4, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(fused(ids).logits, composed(ids).logits, atol=1e-5, rtol=1e-5)
