"""The run certificate through the CLI: a fit writes ``checkpoints/run.json``; ``validate --certificate`` replays
its held-out evaluation of a copied checkpoint in a fresh process elsewhere and matches; a changed chat template
and package version are named; bad input is one line (docs/reliability.md, "Run certificate")."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.cli import TINY, run_cli

from roll_lightning.checkpoints import verify
from roll_lightning.checkpoints.fingerprint import json_digest
from roll_lightning.exits import CERTIFICATE_DIFFERS
from roll_lightning.rollout.scheduling.ledger import group_seed

EPISODES = 8
SETTINGS = [  # the untrained and the trained policy evaluated greedily on 8 held-out FrozenLake maps
    "--config", TINY, "--model.model", "tiny-words", "--trainer.logger", "false",
    "--data.rollout.env_config", '{"size": 4, "is_slippery": false, "max_steps": 6, "lenient": true}',
    "--data.rollout.episode.sampling.max_new_tokens", "1", "--data.rollout.episode.max_turns", "6",
    "--data.evaluation.episodes", str(EPISODES), "--data.evaluation.temperature", "0",
]  # fmt: skip
FIT = ["--model.rollout_steps", "2", "--data.evaluation.during_fit", "true", "--data.evaluation.at_fit_start", "true",
       "--trainer.val_check_interval", "2"]  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fit's folder (``run/checkpoints``: last.ckpt, run.json; ``cache``: its tiny model)."""
    where = tmp_path_factory.mktemp("fit")
    done = run_cli("fit", *SETTINGS, *FIT, "--trainer.default_root_dir", str(where / "run"), cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    return where


def certificate(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "run.json").read_text())


def replay(tmp_path: Path, checkpoint: Path | None, run_json: Path, *more: str) -> tuple[int, list[str]]:
    """``validate --certificate`` in a fresh process whose cwd, root and model cache are elsewhere: its lines
    (``checkpoint`` None: the untrained policy's result)."""
    weights = [] if checkpoint is None else ["--ckpt_path", str(checkpoint)]
    done = run_cli("validate", *SETTINGS, "--trainer.default_root_dir", str(tmp_path / "run"), *weights,
                   "--certificate", str(run_json), *more, cwd=tmp_path)  # fmt: skip
    assert done.returncode in (0, CERTIFICATE_DIFFERS), done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("certificate "))
    return done.returncode, lines[start:]


def item(lines: list[str], label: str) -> str:
    (line,) = [line.strip() for line in lines if line.strip().startswith(f"{label}:")]
    return line.split(":", 1)[1].strip()


def copied(fitted: Path, to: Path) -> Path:
    """The fit's last checkpoint and run.json, copied to another folder (as to another machine)."""
    to.mkdir()
    for name in ("last.ckpt", "run.json"):
        shutil.copy(fitted / "run" / "checkpoints" / name, to / name)
    return to


def test_a_fit_writes_what_its_held_out_numbers_depend_on(fitted: Path) -> None:
    folder = fitted / "run" / "checkpoints"
    cert = certificate(folder)
    assert {"roll_lightning", "torch", "transformers", "lightning", "grpcio", "python"} <= set(cert["versions"])
    (model,) = (fitted / "cache" / "models").glob("tiny-*words*")
    weights = hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest()
    assert cert["model"]["weights_sha256"] == json_digest([["model.safetensors", weights]])  # the bytes, hashed
    template = (model / "chat_template.jinja").read_text()
    assert cert["tokenizer"]["chat_template_sha256"] == hashlib.sha256(template.encode()).hexdigest()
    env = cert["envs"]["frozenlake"]
    assert env["version"] == "1" and env["config"]["lenient"] is True  # as the server reported it
    assert cert["seeds"]["run_seed"] == 0 and cert["decoding"]["temperature"] == 0.0
    assert cert["decoding"]["max_new_tokens"] == 1
    assert cert["engine"] == {"kind": "transformers", "dtype": "float32", "device": "cpu", "replicas": 1,
                              "accelerator": ""}  # fmt: skip
    assert cert["panel"] == {"frozenlake": sorted(group_seed(0, i, "eval") for i in range(EPISODES))}
    untrained, trained = cert["results"]
    assert (untrained["step"], untrained["checkpoint_sha256"]) == (0, None)
    stamp = verify(folder / "last.ckpt")
    assert stamp is not None and (trained["step"], trained["checkpoint_sha256"]) == (2, stamp.sha256)
    assert trained["episodes"] == len(trained["outcomes"]) == EPISODES
    assert trained["success_rate"] == sum(o[2] for o in trained["outcomes"]) / EPISODES


def test_the_check_in_a_fresh_process_elsewhere_matches(fitted: Path, tmp_path: Path) -> None:
    """Another folder, another cwd, the tiny model built again in another cache: every item matches, exit 0."""
    elsewhere = copied(fitted, tmp_path / "copy")
    status, lines = replay(tmp_path, elsewhere / "last.ckpt", elsewhere / "run.json")
    assert status == 0, "\n".join(lines)
    items = [line for line in lines[1:-1] if not line.strip().startswith("(not compared")]  # another's commit
    assert len(items) >= 20 and all(" match (" in line for line in items), "\n".join(lines)
    fit_result = certificate(elsewhere)["results"][1]
    assert item(lines, "checkpoint").startswith(f"match (sha256 {fit_result['checkpoint_sha256'][:12]}")
    assert lines[-1].startswith("verdict: match:") and "greedy: every episode must be identical" in lines[-1]
    (result,) = certificate(tmp_path / "run" / "checkpoints")["results"]  # the replay keeps its own certificate
    assert result["by"] == "validate" and result["tokens_sha256"] == fit_result["tokens_sha256"]


def test_a_changed_chat_template_and_package_version_are_named(fitted: Path, tmp_path: Path) -> None:
    """The model folder's chat template really changed (an extra newline after each role), and the certificate
    says another transformers played it: both named, the prompts' token ids differ, exit 3."""
    elsewhere = copied(fitted, tmp_path / "copy")
    (model,) = (fitted / "cache" / "models").glob("tiny-*words*")
    changed = shutil.copytree(model, tmp_path / "model")
    template = (changed / "chat_template.jinja").read_text()
    for old in ("message['role'] + '\n' + message['content']", "'<|im_start|>assistant\n'"):
        assert template.count(old) == 1
        template = template.replace(old, old.replace("\n", "\n\n"))
    (changed / "chat_template.jinja").write_text(template)
    cert = certificate(elsewhere)
    now = cert["versions"]["transformers"]
    cert["versions"]["transformers"] = "4.0.0"
    (elsewhere / "run.json").write_text(json.dumps(cert))

    status, lines = replay(tmp_path, elsewhere / "last.ckpt", elsewhere / "run.json", "--model.model", str(changed))
    assert status == CERTIFICATE_DIFFERS, "\n".join(lines)
    assert item(lines, "transformers") == f"differs: was 4.0.0, now {now}"
    assert item(lines, "chat template").startswith("differs: was sha256 ")
    assert item(lines, "first prompts").startswith(f"differs: {EPISODES} of {EPISODES} episodes")
    for unchanged in ("torch", "model weights", "tokenizer", "env frozenlake", "seed panel", "checkpoint", "decoding"):
        assert item(lines, unchanged).startswith("match ("), unchanged
    assert item(lines, "held-out result").startswith("differs: ")
    assert lines[-1].startswith("verdict: differs: the held-out result differs")
    assert lines[-1].endswith("changed: transformers, chat template, first prompts"), lines[-1]


@pytest.mark.parametrize("content", [None, "{not json", '{"format": "roll_lightning run certificate 1"}'])
def test_a_missing_or_garbled_certificate_is_one_line(fitted: Path, tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "run.json"
    if content is not None:
        path.write_text(content)
    done = run_cli("validate", *SETTINGS, "--trainer.default_root_dir", str(tmp_path / "run"), "--certificate",
                   str(path), cwd=tmp_path, ROLL_LIGHTNING_CACHE=str(fitted / "cache"))  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"roll_lightning: error: run certificate {path} ") and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_a_checkpoint_the_certificate_has_no_result_for_is_one_line(fitted: Path, tmp_path: Path) -> None:
    folder = fitted / "run" / "checkpoints"
    done = run_cli("validate", *SETTINGS, "--trainer.default_root_dir", str(tmp_path / "run"), "--ckpt_path",
                   str(folder / "previous.ckpt"), "--certificate", str(folder / "run.json"), cwd=tmp_path,
                   ROLL_LIGHTNING_CACHE=str(fitted / "cache"))  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith(
        f"roll_lightning: error: run certificate {folder / 'run.json'} holds no held-out result for checkpoint "
        f"{folder / 'previous.ckpt'} (rollout step 1, sha256 "
    ), said


def test_a_two_rank_runs_evaluation_is_certified_whole_and_checks_on_one_rank(tmp_path: Path) -> None:
    """Two FSDP2 ranks each play half of the held-out panel: run.json holds all of it (gathered from both ranks),
    the same panel one rank plays (held-out group g is the same board on any number of ranks), and a one-rank
    ``validate --certificate`` of the untrained policy matches it episode by episode."""
    from support.cli import TWO_RANKS

    per_rank = EPISODES // 2
    settings = [*SETTINGS, "--data.evaluation.episodes", str(per_rank)]  # the later value wins: 4 per rank
    done = run_cli(
        "fit", *settings, *TWO_RANKS, "--model.rollout_steps", "1", "--data.evaluation.during_fit", "true",
        "--data.evaluation.at_fit_start", "true", "--trainer.default_root_dir", str(tmp_path / "two"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cert = certificate(tmp_path / "two" / "checkpoints")
    untrained = cert["results"][0]
    assert untrained["episodes"] == len(untrained["outcomes"]) == EPISODES
    status, lines = replay(tmp_path, None, tmp_path / "two" / "checkpoints" / "run.json")
    assert status == 0, "\n".join(lines)
    assert item(lines, "held-out result").startswith("match")
