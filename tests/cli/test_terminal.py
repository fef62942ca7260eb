"""What a person sees: the progress line (piped and in a terminal), evaluation lines, the summary at the end, and
no warnings that do not apply (`roll_lightning.quiet`). Real runs of the CLI on the tiny model."""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from support.cli import TINY, cli_env, run_cli

from roll_lightning.models import tiny

EVALUATING = [
    "--data.evaluation", '{"episodes": 8, "at_fit_start": true, "during_fit": true}',
    "--trainer.val_check_interval", "2",
]  # fmt: skip
# Lines a fit printed before roll_lightning.quiet: none of them may come back.
NOISE = re.compile(r"Warning|deprecated|experimental|across ranks is zero|💡|Loading weights|Epoch \d|v_num")


def test_a_piped_run_prints_progress_evaluations_and_where_everything_went(tmp_path: Path) -> None:
    args = ["fit", "--config", TINY, "--model.rollout_steps", "3", "--trainer.default_root_dir", "run", *EVALUATING]
    done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    model = f"tiny-v{tiny.RECIPE_VERSION}-seed0"  # the cached folder's name, which says the recipe that built it
    assert out[0].startswith(f"fit: {model} (189k weights) on frozenlake, 8 episodes per rollout step, 3 steps")
    steps = [line for line in out if line.startswith("step ")]
    assert steps[0].startswith("step 1/3 (33%)") and steps[-1].startswith("step 3/3 (100%)"), out
    assert all(re.search(r"ETA \d+:\d\d \| success \d\.\d\d return -?\d\.\d\d", line) for line in steps)
    assert re.search(r"\| \d+\.\d\d s/step: rollout \d+\.\d\d train \d+\.\d\d sync \d\.\d{3}$", steps[-1])
    evals = [line for line in out if line.startswith("held-out success")]
    assert [re.search(r"after (\d+) rollout steps", line)[1] for line in evals] == ["0", "2", "3"]  # and at the end
    assert "points since the first evaluation" in evals[1] and "held-out" in steps[-1]
    assert not NOISE.search(done.stdout + done.stderr), done.stderr
    # The summary names what was written, and its resume command works as printed.
    summary = out[out.index(next(line for line in out if line.startswith("run: run (3 rollout steps"))) :]
    rows = dict(line.split(None, 1) for line in summary[1:])
    assert rows["checkpoint"] == "run/checkpoints/last.ckpt (after rollout step 3)"
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert rows["tensorboard"] == "tensorboard --logdir run/lightning_logs"
    assert (tmp_path / rows["episodes"].split()[4] / "index.html").is_file()
    assert rows["resume"] == shlex.join(["python", "-m", "roll_lightning", *args, "--ckpt_path", "last"])
    resume = shlex.split(rows["resume"])[3:] + ["--model.rollout_steps", "4"]
    again = run_cli(*resume, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ", resuming after step 3 -> run" in again.stdout.splitlines()[0]
    assert "step 4/4 (100%)" in again.stdout and "held-out success" not in again.stdout.split("step 4/4")[0][-200:]
    # step 3's checkpoint, written before the evaluation at the end, was written again with it
    assert re.search(r"^step 4/4 .*\| held-out [\d.]+% \(step 3\) \|", again.stdout, re.MULTILINE), again.stdout
    # validate prints what it measured, once, and none of the fit's evaluations kept in the checkpoint
    checked = run_cli(*shlex.split(rows["validate"])[3:], cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    said = checked.stdout + checked.stderr
    assert re.search(r"validate: held-out success [\d.]+% over 8 episodes, invalid replies [\d.]+%, with the weights "
                     r"after 4 rollout steps", said), said  # fmt: skip
    assert "after 0 rollout steps" not in said and "points since the first evaluation" not in said


def test_a_resumed_run_shows_the_evaluation_of_the_step_its_checkpoint_holds(tmp_path: Path) -> None:
    """A checkpoint due at a step that is evaluated (every 2 steps, evaluated every 2) is written before the
    evaluation runs, then again, in place, with it: the resumed run's progress line shows step 2's evaluation,
    not step 0's."""
    args = ["fit", "--config", TINY, "--trainer.default_root_dir", "run", *EVALUATING,
            "--trainer.callbacks+=roll_lightning.checkpoints.StepCheckpoint",
            "--trainer.callbacks.every_n_train_steps=2"]  # fmt: skip
    first = run_cli(*args, "--model.rollout_steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in folder.glob("*.ckpt")) == ["last.ckpt"]  # the same step: no previous.ckpt
    held = torch.load(folder / "last.ckpt", weights_only=False)
    assert held["rollout_steps"] == 2 and [report["step"] for report in held["eval_reports"]] == [0, 2]
    again = run_cli(*args, "--model.rollout_steps", "3", "--ckpt_path", "last", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    (line,) = [line for line in again.stdout.splitlines() if line.startswith("step 3/3")]
    assert re.search(r"\| held-out [\d.]+% \(step 2\) \|", line), line


def test_a_terminal_run_redraws_one_progress_line(tmp_path: Path) -> None:
    """stdout is a real pseudo-terminal here: the line is redrawn in place (carriage return, erase line)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "roll_lightning", "fit", "--config", TINY, "--model.rollout_steps", "3",
         "--trainer.default_root_dir", "run"],
        cwd=tmp_path, env=cli_env(tmp_path), stdout=follower, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the follower side closed: the process is gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    os.close(leader)
    text = b"".join(chunks).decode()
    redraws = re.findall(r"\r\x1b\[2K(step \d/3[^\r\n]*)", text)
    assert [line.split()[1] for line in redraws][:3] == ["1/3", "2/3", "3/3"], text
    assert "\r\x1b[2Kstep 3/3 (100%)" in text and "\nrun: run (3 rollout steps" in text.replace("\r\n", "\n")
