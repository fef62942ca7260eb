"""`python -m roll_lightning fit` end to end with the tiny model, the shipped configs, and config errors."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent.parent
OVERLAYS = {"gpu.yaml"}  # added after an env config, never used alone
CONFIGS = sorted(c for c in (ROOT / "configs").glob("*.yaml") if c.name not in OVERLAYS)


def run_cli(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(cwd / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "roll_lightning", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("gpu", [False, True], ids=["as-written", "gpu-overlay"])
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_parses_and_validates(
    config: Path, gpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hub models are not here, so the model is the tiny one; with the GPU overlay the accelerator is the CPU
    (FSDP2 over one CPU rank). Everything else is the configs' own."""
    from roll_lightning.cli import RollLightningCLI
    from roll_lightning.module import AgentRLModule
    from roll_lightning.rollout.datamodule import RolloutDataModule

    monkeypatch.setenv("ROLL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ROLL_MODEL", "tiny")
    overlay = ["--config", str(ROOT / "configs" / "gpu.yaml"), "--trainer.accelerator", "cpu"] if gpu else []
    cli = RollLightningCLI(
        AgentRLModule,
        RolloutDataModule,
        args=["--config", str(config), *overlay, "--trainer.logger", "false"],
        run=False,
        parser_kwargs={"parser_mode": "omegaconf+"},
    )
    rollout = cli.datamodule.rollout
    assert rollout.batch_size % rollout.group_size == 0
    assert cli.model.algorithm.temperature == rollout.episode.sampling.temperature
    assert Path(cli.model.model_path).is_dir() and cli.datamodule.model == cli.model.model_path
    if gpu:
        assert cli.datamodule.engine_config.kind == "vllm" and cli.model.param_dtype == "bfloat16"
        assert type(cli.trainer.strategy).__name__ == "ModelParallelStrategy"


def test_fit_trains_syncs_logs_and_checkpoints(tmp_path: Path) -> None:
    done = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--model.rollout_steps",
        "2",
        "--trainer.default_root_dir",
        str(tmp_path / "run"),
        "--trainer.logger",
        "CSVLogger",
        "--trainer.logger.save_dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    metrics_file = next((tmp_path / "run").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics_file.open()))
    logged = {k for row in rows for k, v in row.items() if v}
    for key in (
        "rollout/success_rate",
        "rollout/return_mean",
        "env/step_latency_s",
        "train/pg_loss",
        "train/logprob_gap",
        "sync/total_s",
        "sync/policy_version",
        "timing/rollout_s",
        "timing/train_s",
    ):
        assert key in logged, key
    assert not any(k.startswith("rollout/eval_") for k in logged)  # evaluation only when asked for
    versions = sorted(float(r["sync/policy_version"]) for r in rows if r.get("sync/policy_version"))
    assert versions == [1.0, 2.0]
    assert list((tmp_path / "run").rglob("*.ckpt"))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--data.rollout.batch_size", "6"], "batch_size=6 is not divisible by rollout.group_size=4"),
        (["--data.rollout.group_size", "1", "--data.rollout.batch_size", "4"], "group_size=1.*grpo"),
        (["--model.model", "/nowhere/model"], "model.model: '/nowhere/model'"),
        (["--model.algorithm.estimator", "gigpo"], "layout: step"),
    ],
    ids=["batch-not-divisible", "group-of-one", "bad-model-path", "gigpo-trajectory-rows"],
)
def test_config_errors_fail_before_any_work_naming_the_key(override: list[str], message: str, tmp_path: Path) -> None:
    done = run_cli("fit", "--config", str(ROOT / "configs" / "tiny.yaml"), *override, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    assert pytest.importorskip("re").search(message, done.stderr), done.stderr[-2000:]
    assert "Loading weights" not in done.stderr  # nothing started


def test_an_unknown_env_id_is_named(tmp_path: Path) -> None:
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--data.rollout.env_id", "sokobann", cwd=tmp_path
    )
    assert done.returncode != 0
    assert "sokobann" in done.stderr and "data.rollout.env_id" in done.stderr, done.stderr[-2000:]


def _unused(_: Any) -> None:  # keeps the Any import honest for type checkers
    return None


def _dumped_groups(root: Path) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for path in root.rglob("step_*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        out[int(path.stem.split("_")[1])] = sorted({e["group"] for e in lines})
    return out


STEPS = 6
RESUME_ARGS = [
    "--config", str(ROOT / "configs" / "tiny.yaml"), "--model.rollout_steps", str(STEPS), "--trainer.logger", "false",
    "--trainer.callbacks+=roll_lightning.callbacks.TrajectoryDump", "--trainer.callbacks.every_n_steps", "1",
    "--trainer.callbacks.max_episodes", "0",
]  # fmt: skip


def test_killed_run_resumes_from_last_without_repeating_or_skipping_groups(tmp_path: Path) -> None:
    """SIGKILL mid-run, then `--ckpt_path last`: the groups the final model was trained on are exactly those of
    an uninterrupted run (the step in flight at the kill is redone, nothing else)."""
    straight = run_cli("fit", *RESUME_ARGS, "--trainer.default_root_dir", str(tmp_path / "a"), cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    expected = _dumped_groups(tmp_path / "a")
    assert sorted(expected) == list(range(1, STEPS + 1))

    run_b = tmp_path / "b"
    env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "roll_lightning", "fit", *RESUME_ARGS, "--trainer.default_root_dir", str(run_b)]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(30_000):  # until the second rollout step has ended (a hang guard, not a timing)
            if list(run_b.rglob("step_000002.jsonl")) or proc.poll() is not None:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    import torch

    done_steps = torch.load(next(run_b.rglob("last.ckpt")), weights_only=False)["rollout_steps"]
    assert 1 <= done_steps < STEPS
    trained_before_kill = {k: v for k, v in _dumped_groups(run_b).items() if k <= done_steps}
    for path in run_b.rglob("step_*.jsonl"):
        path.unlink()
    resumed = run_cli(
        "fit", *RESUME_ARGS, "--trainer.default_root_dir", str(run_b), "--ckpt_path", "last", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _dumped_groups(run_b)
    assert sorted(after) == list(range(done_steps + 1, STEPS + 1))
    assert {**trained_before_kill, **after} == expected


def test_validate_plays_held_out_episodes_only(tmp_path: Path) -> None:
    done = run_cli(
        "validate", "--config", str(ROOT / "configs" / "tiny.yaml"), "--data.evaluation.episodes", "6",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "run"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    logged = {k for row in rows for k, v in row.items() if v}
    assert {"rollout/eval_success_rate", "rollout/eval_return_mean"} <= logged
    assert not any(k.startswith("train/") for k in logged)  # no update happened
