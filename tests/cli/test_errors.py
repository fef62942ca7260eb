"""Bad input to ``python -m roll_lightning``: one line naming the file or key, exit status 2, nothing run.

Run as users run it, each a process of its own (forked with the CLI's imports done, `support.preimported`; one
test checks that a new interpreter says the same); `ROLL_DEBUG=1` brings the traceback back. The rule that tells
bad input from a bug (`roll_lightning.exits.is_input_error`) and the reading of negative numbers are checked directly.
"""

from __future__ import annotations

import json
import re
import subprocess
from argparse import ArgumentError
from pathlib import Path

import pytest
from support.cli import TINY, run_cli, run_cli_fresh

from roll_lightning.exits import is_input_error, is_peer_gone, join_negative_values

BAD_YAML = "model:\n  model: tiny\n rollout_steps: 3\n"  # the third line's indentation breaks the mapping


def error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("roll_lightning: error:")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "bad.yaml"], r"bad\.yaml, line 3, column 2: expected <block end>"),
        (["--config", TINY, "--config", "nowhere.yaml"], r"nowhere\.yaml"),
        (["--config", TINY, "--model.optim.lr", "-1e-4"], r"model\.optim\.lr must be > 0, got -0\.0001$"),
        (["--config", TINY, "--model.rollout_steps", "-1"], r"model\.rollout_steps must be >= 1.*got -1$"),
        (["--config", TINY, "--model.rollout_steps", "0"], r"model\.rollout_steps must be >= 1.*got 0$"),
        (
            ["--config", TINY, "--data.rollout.episode.sampling.temperature", "0"],
            r"data\.rollout\.episode\.sampling\.temperature must be > 0 for training, got 0\.0: .*log softmax\(logits"
            r" / temperature\).*greedy decoding is for evaluation only \(data\.evaluation\.temperature: 0\)",
        ),
        (["--config", TINY, "--model.algorithm.gamma", "1.5"], r"model\.algorithm\.gamma must be in \[0, 1\]"),
        (["--config", TINY, "--data.engine.max_batch_size", "0"], r"data\.engine\.max_batch_size must be >= 1"),
        (["--config", TINY, "--data.evaluation.episodes", "0"], r"data\.evaluation\.episodes must be >= 1"),
        (["--config", TINY, "--model.optim.rate", "1"], r"unrecognized arguments: --model\.optim\.rate 1"),
        (["--config", TINY, "--model.model", "/nowhere/model"], r"model\.model: '/nowhere/model' is not a local"),
        (["--config", TINY, "--trainer.max_time", "00:00:1:00"], r"'00:00:1:00'.* Expected a string in the format DD"),
        (["--config", TINY, "--data.rollout.seed", "3"], r'"data.rollout.seed" must be given via "seed_everything"'),
    ],
    ids=[
        "malformed-yaml", "missing-config-file", "negative-lr", "negative-rollout-steps", "zero-rollout-steps",
        "temperature-zero", "gamma-above-one", "engine-batch-zero", "no-eval-episodes", "unknown-key", "no-model",
        "max-time-format", "part-seed",
    ],
)  # fmt: skip
def test_an_input_error_is_one_line_naming_what_is_wrong(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    done = run_cli("fit", *args, cwd=tmp_path, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = error_lines(done)
    assert re.search(message, line), line
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr, done.stderr[-3000:]
    assert "model.algorithm.temperature" not in done.stderr  # the linked copy is not what the user set
    assert not list(tmp_path.rglob("*.ckpt")) and "Loading weights" not in done.stderr  # nothing ran


def test_a_new_interpreter_says_the_same_as_a_preimported_one(tmp_path: Path) -> None:
    """The CLI tests run ``python -m roll_lightning`` forked with its imports done (`support.preimported`): a new
    interpreter, as a user's shell starts it, gives the same status and line for a malformed config."""
    (tmp_path / "bad.yaml").write_text(BAD_YAML)
    fresh, preimported = (run("fit", "--config", "bad.yaml", cwd=tmp_path) for run in (run_cli_fresh, run_cli))
    assert fresh.returncode == preimported.returncode == 2, fresh.stderr[-3000:]
    assert error_lines(fresh) == error_lines(preimported) != []


def test_the_vllm_engine_without_vllm_says_what_to_install(tmp_path: Path) -> None:
    """vLLM is hidden (`support.without_vllm`); before, this was a raw `ModuleNotFoundError` traceback."""
    args = ["fit", "--config", TINY, "--data.engine.kind", "vllm", "--trainer.logger", "false"]
    done = run_cli(*args, cwd=tmp_path, module="support.without_vllm", timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = error_lines(done)
    assert "data.engine.kind: vllm needs vLLM, which is not installed: pip install 'roll_lightning[vllm]'" in line
    assert "data.engine.kind: transformers" in line
    assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr
    assert not list(tmp_path.rglob("*.ckpt"))


def test_roll_debug_shows_the_traceback_of_an_input_error(tmp_path: Path) -> None:
    done = run_cli("fit", "--config", TINY, "--model.rollout_steps", "-1", cwd=tmp_path, timeout=300, ROLL_DEBUG="1")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "TrainingConfigError: model.rollout_steps must be >= 1" in done.stderr
    assert not error_lines(done)


def test_negative_numbers_after_an_option_are_its_value() -> None:
    argv = ["fit", "--a", "-1e-4", "--b", "-1", "--c=-2", "--d", "-x", "--e", "-inf", "-c", "-3", "--", "-4"]
    assert join_negative_values(argv) == [
        "fit", "--a=-1e-4", "--b=-1", "--c=-2", "--d", "-x", "--e=-inf", "-c", "-3", "--", "-4",
    ]  # fmt: skip


def _raised(action: object) -> BaseException:
    try:
        action()  # type: ignore[operator]
    except BaseException as err:  # noqa: BLE001  (the test inspects whatever was raised)
        return err
    raise AssertionError("nothing was raised")


def test_bad_input_is_told_from_bugs() -> None:
    """The project's named errors and its own checks are bad input; a ValueError from a library, or any other
    exception, is a bug and keeps its traceback."""
    from roll_lightning.models import resolve_model
    from roll_lightning.training import AlgorithmConfig

    assert is_input_error(ArgumentError(None, "unrecognized arguments: --x"))
    assert is_input_error(_raised(lambda: AlgorithmConfig(gamma=2.0)))  # TrainingConfigError
    assert is_input_error(_raised(lambda: resolve_model("/nowhere/model")))  # a plain ValueError of ours
    assert not is_input_error(_raised(lambda: json.loads("{")))  # a ValueError raised inside a library
    assert not is_input_error(_raised(lambda: __import__("no_such_module_here")))
    assert not is_input_error(RuntimeError("a bug"))


def test_a_peer_gone_is_gloo_s_lost_connection_only() -> None:
    """The line that points at another rank's log is for gloo's lost peer (tests/cli/test_multi_node.py shows it
    end to end); the same words from anything else stay a bug with its traceback."""
    gloo = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:45803."
    assert is_peer_gone(RuntimeError(gloo))
    assert not is_peer_gone(RuntimeError("Connection reset by peer"))  # an HTTP client's, say
    assert not is_peer_gone(ValueError(gloo))
