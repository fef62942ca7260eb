"""The run certificate's parts without a run: its file round trip, which result a checkpoint finds, a changed setup
set aside, and the comparison's rules (greedy: identical; sampled: within 3 binomial standard errors)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from roll_lightning.checkpoints.certificate import (
    Certificate,
    CertificateError,
    HeldOut,
    Outcome,
    Setup,
    continue_or_set_aside,
)
from roll_lightning.checkpoints.certificate_check import compare


def setup(temperature: float = 0.0, **changes: object) -> Setup:
    parts: dict[str, object] = {
        "versions": {"python": "3.11.7", "torch": "2.13.0", "transformers": "5.19.0"},
        "model": {"weights_sha256": "a" * 64, "config_sha256": "b" * 64},
        "tokenizer": {"tokenizer_sha256": "c" * 64, "chat_template_sha256": "d" * 64},
        "episode": {"sokoban": {"layout": "step", "max_turns": 10, "prompt": {"system_prompt": ""}}},
        "envs": {"sokoban": {"env_id": "sokoban", "version": "1", "config": {"dim_room": [6, 6]}}},
        "seeds": {"run_seed": 0, "engine_seed": 0, "stream": "group_seed", "salts": {"sokoban": None}},
        "engine": {"kind": "transformers", "dtype": "float32", "device": "cpu", "replicas": 1, "accelerator": ""},
        "decoding": {"temperature": temperature, "max_new_tokens": 1},
    }
    return Setup(**{**parts, **changes})  # type: ignore[arg-type]


def result(successes: int, episodes: int, step: int = 5, sha: str | None = "e" * 64, tokens: str = "t") -> HeldOut:
    outcomes = tuple(
        Outcome("sokoban", 2 * i + 1, i < successes, 10.0 if i < successes else -1.0, f"p{i}", f"{tokens}{i}")
        for i in range(episodes)
    )
    return HeldOut(step, step, outcomes, sha)


def item(report_lines: list[str], label: str) -> str:
    (line,) = [line.strip() for line in report_lines if line.strip().startswith(f"{label}:")]
    return line.split(":", 1)[1].strip()


def test_the_file_round_trips_and_a_checkpoint_finds_its_result(tmp_path: Path) -> None:
    cert = Certificate(setup(), [result(3, 8, step=0, sha=None), result(4, 8, step=5)], {"by": "fit"})
    path = tmp_path / "run.json"
    cert.write(path)
    again = Certificate.read(path)
    assert again.setup == cert.setup and again.results == cert.results
    assert json.loads(path.read_text())["panel"] == {"sokoban": [1, 3, 5, 7, 9, 11, 13, 15]}
    assert again.result_for("e" * 64, 5) == cert.results[1]  # by digest
    assert again.result_for("f" * 64, 5) == cert.results[1]  # another file of step 5: by step (then "differs")
    assert again.result_for(None, 0) == cert.results[0]  # no checkpoint: the untrained model
    assert again.result_for("f" * 64, 7) is None
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"format": "roll_lightning run certificate 1", "versions": {}}'])
def test_what_is_not_a_certificate_is_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "run.json"
    path.write_text(text)
    with pytest.raises(CertificateError, match=f"^run certificate {path} ") as raised:
        Certificate.read(path)
    assert "\n" not in str(raised.value)


def test_a_changed_setup_sets_the_old_certificate_aside(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    Certificate(setup(), [result(1, 4)]).write(path)
    assert continue_or_set_aside(path, setup()) == ([result(1, 4)], None)  # same setup: its results go on
    changed = setup(versions={"python": "3.12.0", "torch": "2.13.0", "transformers": "5.19.0"})
    assert continue_or_set_aside(path, changed) == ([], tmp_path / "run.1.json")
    assert not path.exists() and Certificate.read(tmp_path / "run.1.json").results == [result(1, 4)]


def test_greedy_must_be_identical_and_names_what_changed() -> None:
    report = compare(setup(), result(3, 8), setup(), result(3, 8))
    assert report.matches and report.lines()[-1].startswith("verdict: match:")
    template = {"tokenizer_sha256": "c" * 64, "chat_template_sha256": "9" * 64}
    report = compare(setup(), result(3, 8), setup(tokenizer=template), result(3, 8, tokens="u"))
    lines = report.lines()
    assert not report.matches and report.changed == ["chat template"]
    assert item(lines, "chat template") == f"differs: was sha256 {'d' * 12}, now sha256 {'9' * 12}"
    assert item(lines, "held-out result") == (
        "differs: 3/8 (37.5%) both; of the 8 episodes played on both sides 0 ended otherwise, 8 differ in token ids "
        "(seeds 1, 3, 5, 7, 9, ...)"
    )
    assert lines[-1] == (
        "verdict: differs: the held-out result differs (greedy: every episode must be identical, token for token); "
        "changed: chat template"
    )
    fewer = compare(setup(), result(3, 8), setup(), result(2, 8))
    assert item(fewer.lines(), "held-out result") == (
        "differs: was 3/8 (37.5%), now 2/8 (25.0%); of the 8 episodes played on both sides 1 ended otherwise, "
        "1 differ in token ids (seeds 5)"
    )
    assert "no recorded dependency changed" in fewer.lines()[-1]


def test_sampled_results_agree_within_three_standard_errors() -> None:
    sampled = setup(temperature=1.0)
    close = compare(sampled, result(44, 128), sampled, result(47, 128, tokens="u"))
    assert close.matches, close.lines()
    assert item(close.lines(), "held-out result") == (
        "match (was 44/128 (34.4%), now 47/128 (36.7%): |difference| 2.3 points <= 3 SE = 17.9 points)"
    )
    far = compare(sampled, result(20, 128), sampled, result(60, 128))
    assert not far.matches and far.changed == []
    assert far.lines()[-1].startswith("verdict: differs: the held-out result differs (sampled at temperature 1.0: ")
    assert "no recorded dependency changed" in far.lines()[-1]


def test_settings_name_the_keys_that_differ() -> None:
    prompt = {"sokoban": {"layout": "step", "max_turns": 10, "prompt": {"system_prompt": "Play."}}}
    other_env = {"sokoban": {"env_id": "sokoban", "version": "2", "config": {"dim_room": [6, 6]}}}
    report = compare(setup(), result(1, 4), setup(episode=prompt, envs=other_env), result(1, 4))
    lines = report.lines()
    assert item(lines, "episode settings") == "differs: sokoban.prompt.system_prompt was '', now 'Play.'"
    assert item(lines, "env sokoban") == "differs: version was '1', now '2'"
    assert report.changed == ["episode settings", "env sokoban"]
    moved = dataclasses.replace(result(1, 4), checkpoint_sha256="f" * 64)
    assert item(compare(setup(), result(1, 4), setup(), moved).lines(), "checkpoint").startswith("differs: was sha256")
