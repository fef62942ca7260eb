"""`--help` offers only what works: fit and validate, no generic optimiser flags, the built-in model names and
where env ids come from."""

from __future__ import annotations

from pathlib import Path

from support.cli import TINY, run_cli


def test_help_offers_fit_and_validate_only(tmp_path: Path) -> None:
    done = run_cli("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m roll_lightning [-c CONFIG] {fit,validate}")
    assert "fit --config configs/sokoban.yaml" in " ".join(done.stdout.split())
    for subcommand in ("test", "predict"):
        refused = run_cli(subcommand, cwd=tmp_path)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            "roll_lightning: error: argument subcommand: invalid choice: "
            f"'{subcommand}' (choose from 'fit', 'validate')"
        ]


def test_fit_help_names_built_in_models_and_env_ids_and_no_generic_optimiser(tmp_path: Path) -> None:
    done = run_cli("fit", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split()).replace("- ", "-")  # argparse may wrap a line after a name's hyphen
    assert "--optimizer" not in text and "--lr_scheduler" not in text  # model.optim is the optimiser
    for name in ("tiny", "tiny-words", "tiny-grid", "smollm2-135m-instruct"):
        assert f"``{name}``" in text, name
    assert "``gem:<id>``" in text and "python -m env_servers describe ID" in text
    refused = run_cli("fit", "--optimizer", "SGD", cwd=tmp_path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_an_unknown_env_id_is_named_first_without_a_traceback_or_a_summary(tmp_path: Path) -> None:
    done = run_cli(
        "fit", "--config", TINY, "--data.rollout.env_id", "nope", "--trainer.default_root_dir", "run", cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors[0].startswith("roll_lightning: error: data.rollout.env_id='nope'"), done.stderr
    assert "unknown env id 'nope' (known: calculator, frozenlake, lookup, sokoban, webshop" in done.stderr
    assert "run:" not in done.stdout  # nothing ran, so there is nothing to point at
