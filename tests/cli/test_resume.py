"""``--ckpt_path last`` through the CLI with the loggers the shipped configs use: a killed run carries on where
it stopped (nothing replayed from step 0, nothing skipped), and what cannot be resumed is said in one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from support.cli import ROOT, run_cli

STEPS = 6
LOGGERS = {  # each kind of logger a shipped config uses, as CLI arguments for a run rooted at {root}
    "default": [],  # Lightning's: TensorBoardLogger (tensorboard is installed)
    "CSVLogger": ["--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "{root}"],
    # the learning recipes' pair (configs/sokoban.yaml, configs/frozenlake_learn.yaml)
    "CSVLogger+TensorBoardLogger": [
        "--trainer.logger",
        '[{{"class_path": "CSVLogger", "init_args": {{"save_dir": "{root}"}}}}, {{"class_path": "TensorBoardLogger",'
        ' "init_args": {{"save_dir": "{root}", "name": "tensorboard"}}}}]',
    ],
}
KILLS = {  # SIGTERM right after a step's checkpoint, or SIGKILL
    "default": signal.SIGKILL, "CSVLogger": signal.SIGTERM, "CSVLogger+TensorBoardLogger": signal.SIGKILL,
}  # fmt: skip


def shipped_logger_kind(config: Path) -> str:
    logger = (yaml.safe_load(config.read_text()).get("trainer") or {}).get("logger")
    if logger in (None, True):
        return "default"
    loggers = logger if isinstance(logger, list) else [logger]
    return "+".join(sorted(str(one["class_path"]).rsplit(".", 1)[-1] for one in loggers))


def test_every_logger_a_shipped_config_uses_is_covered() -> None:
    kinds = {shipped_logger_kind(c) for c in (ROOT / "configs").glob("*.yaml")}
    assert kinds <= set(LOGGERS), kinds - set(LOGGERS)


def fit_args(root: Path, logger: str, steps: int = STEPS, extra: tuple[str, ...] = ()) -> list[str]:
    return [
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--model.rollout_steps", str(steps),
        "--trainer.default_root_dir", str(root), *(a.format(root=root) for a in LOGGERS[logger]),
        "--trainer.callbacks+=roll_lightning.callbacks.TrajectoryDump", "--trainer.callbacks.every_n_steps", "1",
        "--trainer.callbacks.max_episodes", "0", *extra,
    ]  # fmt: skip


def dumped_groups(log_dir: Path) -> dict[int, list[str]]:
    """Rollout step -> the groups it trained on, from one run's trajectory dumps."""
    out: dict[int, list[str]] = {}
    for path in log_dir.glob("trajectories/step_*.jsonl"):
        out[int(path.stem.split("_")[1])] = sorted({json.loads(line)["group"] for line in path.open()})
    return out


def step_of(path: Path) -> int:
    return int(torch.load(path, weights_only=False, map_location="cpu")["global_step"])


def kill_after_second_checkpoint(root: Path, logger: str, kill: signal.Signals, extra: tuple[str, ...] = ()) -> int:
    """Run fit and send ``kill`` right after the checkpoint of rollout step 2 (or later) was written."""
    last, previous = root / "checkpoints" / "last.ckpt", root / "checkpoints" / "previous.ckpt"
    env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(root.parent / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "roll_lightning", *fit_args(root, logger, extra=extra)],
        cwd=root.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100_000):  # until last.ckpt is a newer file than previous.ckpt (a hang guard, not a timing)
            try:
                if last.stat().st_ino != previous.stat().st_ino:
                    break
            except FileNotFoundError:
                pass
            if proc.poll() is not None:
                break
            time.sleep(0.005)
        proc.send_signal(kill)
        return proc.wait(timeout=300)
    finally:
        proc.kill()


@pytest.mark.parametrize("logger", list(LOGGERS))
def test_a_killed_run_resumes_where_it_stopped_with_each_shipped_logger(logger: str, tmp_path: Path) -> None:
    root = tmp_path / "run"
    status = kill_after_second_checkpoint(root, logger, KILLS[logger])
    assert status == (-signal.SIGKILL if KILLS[logger] == signal.SIGKILL else 128 + signal.SIGTERM)
    folder = root / "checkpoints"
    # no partial, no sibling (run.json: the run certificate)
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "previous.ckpt", "run.json"]
    assert sorted(root.rglob("*.ckpt")) == sorted(folder.glob("*.ckpt"))
    done = step_of(folder / "last.ckpt")
    assert 2 <= done < STEPS and step_of(folder / "previous.ckpt") == done - 1  # last is the newest step
    (first_log,) = root.glob("lightning_logs/version_*")
    if logger == "default":
        assert list(first_log.glob("events.out.tfevents.*"))  # the TensorBoard logger was on
    if "TensorBoardLogger" in logger:
        assert list(root.glob("tensorboard/version_0/events.out.tfevents.*"))
    trained_before = {k: v for k, v in dumped_groups(first_log).items() if k <= done}

    resumed = run_cli(*fit_args(root, logger), "--ckpt_path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Restored all states from the checkpoint at {folder / 'last.ckpt'}" in resumed.stdout + resumed.stderr
    second_log = root / "lightning_logs" / "version_1"
    after = dumped_groups(second_log)
    assert sorted(after) == list(range(done + 1, STEPS + 1))  # carried on: no step played again from 0
    played = [g for groups in (trained_before, after) for step in sorted(groups) for g in groups[step]]
    assert len(played) == len(set(played)) == STEPS * 2  # every group once: none repeated, none skipped
    assert step_of(folder / "last.ckpt") == STEPS


FILTER = (
    "--data.rollout.group_filter.kind", "zero_variance", "--data.rollout.group_filter.max_extra_groups", "2",
)  # fmt: skip


def test_a_killed_two_env_run_resumes_each_env_where_it_stopped(tmp_path: Path) -> None:
    """``data.rollout.envs`` with two tags: each step trains one group of each, and across the SIGKILL and the
    resume each tag's groups 0..STEPS-1 are each played exactly once."""
    two = tmp_path / "two_envs.yaml"
    envs = [
        {"tag": "frozenlake", "env_id": "frozenlake", "groups": 1},
        {"tag": "sokoban", "env_id": "sokoban", "env_config": {"dim_room": [6, 6]}, "groups": 1},
    ]
    two.write_text(yaml.safe_dump({"data": {"rollout": {"env_id": None, "envs": envs}}}))
    extra = ("--config", str(two))
    root = tmp_path / "run"
    assert kill_after_second_checkpoint(root, "default", signal.SIGKILL, extra) == -signal.SIGKILL
    done = step_of(root / "checkpoints" / "last.ckpt")
    (rank,) = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)["RolloutDataModule"]["ranks"]
    assert set(rank["lanes"]) == {"frozenlake", "sokoban"}  # each tag's own position in its groups
    before = {k: v for k, v in dumped_groups(root / "lightning_logs" / "version_0").items() if k <= done}
    resumed = run_cli(*fit_args(root, "default", extra=extra), "--ckpt_path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = dumped_groups(root / "lightning_logs" / "version_1")
    assert sorted(after) == list(range(done + 1, STEPS + 1))
    steps = [*before.values(), *after.values()]
    assert all(sorted(g.split("/")[0] for g in groups) == ["frozenlake", "sokoban"] for groups in steps)
    for tag in ("frozenlake", "sokoban"):
        played = [group_index(g) for groups in steps for g in groups if g.startswith(tag + "/")]
        assert sorted(played) == list(range(STEPS)), tag  # none repeated, none skipped


def settled_groups(checkpoint: Path) -> set[int]:
    """The group indices a checkpoint's rollout state counts as done (trained or filtered out): never replayed."""
    (state,) = torch.load(checkpoint, weights_only=False, map_location="cpu")["RolloutDataModule"]["ranks"]
    (lane,) = state["lanes"].values()
    return set(range(lane["watermark"])) | set(lane["settled_above"])


def group_index(key: str) -> int:
    return int(key.split("/")[1].removeprefix("g"))  # "<env>/g<index>/s<seed>"


def test_a_killed_run_with_a_group_filter_replays_neither_trained_nor_filtered_groups(tmp_path: Path) -> None:
    """The random tiny model's groups are all flat, so the filter drops groups at every step (two refills, then
    the batch is completed with flat groups): what it dropped before the kill is settled in the checkpoint like
    what was trained, and the resumed run plays neither again."""
    root = tmp_path / "run"
    assert kill_after_second_checkpoint(root, "default", signal.SIGKILL, FILTER) == -signal.SIGKILL
    done = step_of(root / "checkpoints" / "last.ckpt")
    settled = settled_groups(root / "checkpoints" / "last.ckpt")
    (first_log,) = root.glob("lightning_logs/version_*")
    before = {group_index(g) for step, groups in dumped_groups(first_log).items() if step <= done for g in groups}
    assert before <= settled and len(settled - before) >= done, "trained and filtered groups are settled"

    resumed = run_cli(*fit_args(root, "default", extra=FILTER), "--ckpt_path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after_steps = dumped_groups(root / "lightning_logs" / "version_1")
    assert sorted(after_steps) == list(range(done + 1, STEPS + 1))
    after = [group_index(g) for groups in after_steps.values() for g in groups]
    assert len(after) == len(set(after)) == (STEPS - done) * 2 and not set(after) & settled, (after, settled)
    assert settled_groups(root / "checkpoints" / "last.ckpt") >= settled | set(after)


def test_a_killed_run_that_keeps_replies_across_syncs_resumes_with_every_group_once(tmp_path: Path) -> None:
    """``on_suspend: keep`` with groups running ahead of the update (``max_staleness: 1``), two envs and a group
    filter: replies stopped at a sync and finished by the next weights; across a SIGKILL and the resume no group
    is trained twice, and none the first run settled (trained or filtered) is played again."""
    two = tmp_path / "two_envs.yaml"
    envs = [
        {"tag": "frozenlake", "env_id": "frozenlake", "groups": 1},
        {"tag": "sokoban", "env_id": "sokoban", "env_config": {"dim_room": [6, 6]}, "groups": 1},
    ]
    two.write_text(yaml.safe_dump({"data": {"rollout": {"env_id": None, "envs": envs}}}))
    extra = (
        "--config", str(two), "--data.rollout.on_suspend", "keep", "--data.rollout.max_staleness", "1", *FILTER,
        "--data.rollout.episode.sampling.max_new_tokens", "64",  # long enough replies to be in flight at a sync
    )  # fmt: skip
    root = tmp_path / "run"
    assert kill_after_second_checkpoint(root, "default", signal.SIGKILL, extra) == -signal.SIGKILL
    last = root / "checkpoints" / "last.ckpt"
    done = step_of(last)
    (rank,) = torch.load(last, weights_only=False, map_location="cpu")["RolloutDataModule"]["ranks"]
    settled = {
        f"{tag}/g{i}"
        for tag, lane in rank["lanes"].items()
        for i in [*range(lane["watermark"]), *lane["settled_above"]]
    }
    (first_log,) = root.glob("lightning_logs/version_*")
    before = [g.rsplit("/", 1)[0] for step, groups in dumped_groups(first_log).items() if step <= done for g in groups]
    assert set(before) <= settled
    resumed = run_cli(*fit_args(root, "default", extra=extra), "--ckpt_path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after_steps = dumped_groups(root / "lightning_logs" / "version_1")
    assert sorted(after_steps) == list(range(done + 1, STEPS + 1))
    after = [g.rsplit("/", 1)[0] for groups in after_steps.values() for g in groups]
    assert len(before + after) == len(set(before + after)), "no group trained twice"
    assert not set(after) & settled, "nothing settled before the kill is played again"
    turns = [t for path in root.rglob("step_*.jsonl") for line in path.open() for t in json.loads(line)["turns"]]
    assert any(t["versions"] for t in turns), "some reply was stopped at a sync and finished by the next weights"


BRANCH = (
    "--data.rollout.episode.layout", "step", "--model.algorithm.estimator", "vine",
    "--data.rollout.branch.every", "1",
)  # fmt: skip


def test_a_killed_branching_run_resumes_with_every_group_once(tmp_path: Path) -> None:
    """Branching rollouts (data.rollout.branch): forks stay inside their group, so a resumed run plays every group
    once, as any run; the dumps show the forks."""
    root = tmp_path / "run"
    assert kill_after_second_checkpoint(root, "default", signal.SIGKILL, BRANCH) == -signal.SIGKILL
    done = step_of(root / "checkpoints" / "last.ckpt")
    (first_log,) = root.glob("lightning_logs/version_*")
    before = {k: v for k, v in dumped_groups(first_log).items() if k <= done}
    resumed = run_cli(*fit_args(root, "default", extra=BRANCH), "--ckpt_path", "last", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    second_log = root / "lightning_logs" / "version_1"
    after = dumped_groups(second_log)
    assert sorted(after) == list(range(done + 1, STEPS + 1))
    played = [g for groups in (before, after) for step in sorted(groups) for g in groups[step]]
    assert len(played) == len(set(played)) == STEPS * 2
    records = [json.loads(line) for path in second_log.glob("trajectories/step_*.jsonl") for line in path.open()]
    assert any(r["branch"] for r in records), "the resumed run forked too"


def test_ckpt_path_last_with_nothing_to_resume_says_so_and_starts_at_step_0(tmp_path: Path) -> None:
    done = run_cli(*fit_args(tmp_path / "run", "default", steps=1), "--ckpt_path", "last", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = tmp_path / "run" / "checkpoints"
    notice = f"roll_lightning: --ckpt_path last: no checkpoint in {folder} yet; starting a new run at step 0"
    assert notice in done.stderr.splitlines()
    assert step_of(folder / "last.ckpt") == 1


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished CLI run of two steps with the default logger: its root."""
    base = tmp_path_factory.mktemp("two_steps")
    done = run_cli(*fit_args(base / "run", "default", steps=2), cwd=base)
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "run"


def test_a_damaged_last_checkpoint_is_named_in_one_line_with_the_intact_one_to_resume_from(
    two_steps: Path, tmp_path: Path
) -> None:
    root = Path(shutil.copytree(two_steps, tmp_path / "run"))
    last, previous = root / "checkpoints" / "last.ckpt", root / "checkpoints" / "previous.ckpt"
    with last.open("r+b") as f:  # 4 KiB patched in the middle: torch.load would load it without a word
        f.seek(last.stat().st_size // 2)
        f.write(b"\0" * 4096)
    refused = run_cli(*fit_args(root, "default", steps=3), "--ckpt_path", "last", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr and "Restoring states" not in refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        f"roll_lightning: error: checkpoint {last} is damaged: its bytes no longer match the SHA-256 written with "
        f"it; {previous} (rollout step 1) is intact: resume from it with --ckpt_path {previous}"
    )
    resumed = run_cli(*fit_args(root, "default", steps=3), "--ckpt_path", str(previous), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    from roll_lightning.checkpoints import verify

    assert verify(previous) is not None and verify(last) is not None  # the damaged file was not kept
    assert [step_of(previous), step_of(last)] == [2, 3]


def test_a_foreign_file_as_last_checkpoint_is_named_in_one_line_by_fit_and_validate(
    two_steps: Path, tmp_path: Path
) -> None:
    """A whole file that torch loads but that is no training checkpoint (written by hand, another program)."""
    root = Path(shutil.copytree(two_steps, tmp_path / "run"))
    last, previous = root / "checkpoints" / "last.ckpt", root / "checkpoints" / "previous.ckpt"
    torch.save({"hello": torch.zeros(3), "global_step": 7}, last)
    expected = (
        f"roll_lightning: error: checkpoint {last} is not a Lightning checkpoint of this trainer (no "
        f"'pytorch-lightning_version'; it holds: hello, global_step); {previous} (rollout step 1) is intact: resume "
        f"from it with --ckpt_path {previous}"
    )
    evaluate = ["validate", "--config", str(ROOT / "configs" / "tiny.yaml"), "--trainer.default_root_dir", str(root)]
    for args in (fit_args(root, "default", steps=3), evaluate):
        refused = run_cli(*args, "--ckpt_path", "last", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "Traceback" not in refused.stderr and refused.stderr.splitlines()[-1] == expected, refused.stderr[-2000:]


def test_a_new_run_into_a_folder_with_checkpoints_is_refused_and_they_are_kept(two_steps: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(two_steps, tmp_path / "run"))
    before = (root / "checkpoints" / "last.ckpt").read_bytes()
    refused = run_cli(*fit_args(root, "default"), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stderr.splitlines()[-1] == (
        f"roll_lightning: error: {root / 'checkpoints'} holds the checkpoints of an earlier run (last.ckpt: rollout "
        "step 2), which a new run would overwrite: resume it with --ckpt_path last, or start a new run in another "
        "--trainer.default_root_dir"
    )
    assert (root / "checkpoints" / "last.ckpt").read_bytes() == before
