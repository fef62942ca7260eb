"""Checkpoints with a logger on: they land in ``<root>/checkpoints`` and ``last`` resumes from there; each write is
whole or absent; a damaged file is refused with one line naming it and the intact one beside it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from support.trainers import checkpointing_trainer as trainer

from roll_lightning.checkpoints import (
    CheckpointError,
    ChecksummedCheckpointIO,
    read_stamp,
    resolve_ckpt_path,
    verify,
)
from roll_lightning.checks.handmade import FixedBatches, handmade_batch
from roll_lightning.training.module import AgentRLModule

TESTS = Path(__file__).parent.parent


class CountSteps(L.Callback):
    """How many rollout steps this process trained (a restored run counts from its checkpoint on)."""

    def __init__(self) -> None:
        self.steps = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.steps += 1


def fit(model_dir: Path, batch: Any, root: Path, steps: int, logger: Any, ckpt_path: str | None = None) -> L.Trainer:
    module = AgentRLModule(str(model_dir))
    module.rollout_steps_limit = steps
    run = trainer(root, logger)
    run.fit(module, datamodule=FixedBatches(batch), ckpt_path=ckpt_path)
    return run


@pytest.fixture(scope="module")
def batch(model_dir: Path, tokenizer: Any) -> Any:
    return handmade_batch(model_dir, tokenizer)


@pytest.fixture(scope="module")
def three_steps(model_dir: Path, batch: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of three rollout steps with the default (TensorBoard) logger: its root folder."""
    root = tmp_path_factory.mktemp("three_steps")
    fit(model_dir, batch, root, 3, TensorBoardLogger(root))
    return root


@pytest.fixture
def run(three_steps: Path, tmp_path: Path) -> Path:
    """A copy of `three_steps` to damage."""
    return Path(shutil.copytree(three_steps, tmp_path / "run"))


def global_step(path: Path) -> int:
    return int(torch.load(path, weights_only=False, map_location="cpu")["global_step"])


@pytest.mark.parametrize("logger", ["tensorboard", "csv"])
def test_last_lands_in_the_root_whatever_the_logger_and_resumes_from_there(
    logger: str, model_dir: Path, batch: Any, tmp_path: Path
) -> None:
    """Each run logs into a new ``version_N``; checkpoints stay in ``<root>/checkpoints``, where ``last``
    finds them. ``last.ckpt`` is the only file a step writes, so no sibling can be newer than it."""
    make = {"tensorboard": lambda: TensorBoardLogger(tmp_path), "csv": lambda: CSVLogger(tmp_path)}[logger]
    fit(model_dir, batch, tmp_path, 2, make())
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in tmp_path.rglob("*.ckpt")) == ["last.ckpt", "previous.ckpt"]
    assert [global_step(folder / "previous.ckpt"), global_step(folder / "last.ckpt")] == [1, 2]

    count = CountSteps()
    resumed = trainer(tmp_path, make(), count)
    path = resolve_ckpt_path("last", resumed, fitting=True)
    assert path == str(folder / "last.ckpt")
    module = AgentRLModule(str(model_dir))
    module.rollout_steps_limit = 4
    resumed.fit(module, datamodule=FixedBatches(batch), ckpt_path=path)
    assert count.steps == 2 and module.steps_done == resumed.global_step == 4  # steps 3 and 4, not 1 to 4
    assert [global_step(folder / "previous.ckpt"), global_step(folder / "last.ckpt")] == [3, 4]
    assert len(list(tmp_path.glob("lightning_logs/version_*"))) == 2


def test_each_checkpoint_carries_the_checksum_and_step_it_is_verified_with(three_steps: Path) -> None:
    last = three_steps / "checkpoints" / "last.ckpt"
    stamp = verify(last)
    assert stamp is not None and stamp == read_stamp(last) and stamp.global_step == global_step(last) == 3
    assert not list((three_steps / "checkpoints").glob(".*"))  # no temporary left


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _random_bytes(path: Path) -> None:
    path.write_bytes(torch.randint(0, 256, (path.stat().st_size,), generator=torch.Generator().manual_seed(0))
                     .to(torch.uint8).numpy().tobytes())  # fmt: skip


def _patch_middle(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xff" * 4096)


DAMAGE = {
    "truncated": (_truncate, "is truncated"),
    "empty": (_empty, "is empty (0 bytes)"),
    "random-bytes": (_random_bytes, "is not a checkpoint"),
    "4KiB-patched": (_patch_middle, "no longer match the SHA-256"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_it_and_the_intact_one(damage: str, run: Path) -> None:
    last, previous = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "previous.ckpt"
    spoil, what = DAMAGE[damage]
    spoil(last)
    with pytest.raises(CheckpointError) as refused:
        ChecksummedCheckpointIO().load_checkpoint(last)
    message = str(refused.value)
    assert "\n" not in message and str(last) in message and what in message, message
    assert f"{previous} (rollout step 2) is intact" in message, message
    assert "weights_only" not in message  # never the advice to unpickle an unknown file unsafely


def test_a_patched_checkpoint_that_torch_loads_silently_stops_the_trainer(
    run: Path, model_dir: Path, batch: Any
) -> None:
    last = run / "checkpoints" / "last.ckpt"
    _patch_middle(last)
    torch.load(last, weights_only=False)  # torch itself does not notice: the reason for the checksum
    with pytest.raises(CheckpointError, match="no longer match the SHA-256"):
        fit(model_dir, batch, run, 4, TensorBoardLogger(run), ckpt_path=str(last))


def test_with_no_intact_checkpoint_left_the_message_says_so(run: Path) -> None:
    folder = run / "checkpoints"
    _truncate(folder / "last.ckpt")
    _empty(folder / "previous.ckpt")
    with pytest.raises(CheckpointError, match=f"no intact checkpoint beside it in {folder}"):
        verify(folder / "last.ckpt")


def test_a_failed_write_keeps_the_checkpoint_there_before_and_leaves_nothing_partial(run: Path) -> None:
    """A real failing write: the file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes ``write`` fail with EFBIG
    halfway through the checkpoint, as a full disk fails with ENOSPC."""
    last = run / "checkpoints" / "last.ckpt"
    before = hashlib.sha256(last.read_bytes()).hexdigest()
    script = (
        "import resource, signal, sys, torch\n"
        "from roll_lightning.checkpoints import CheckpointError, ChecksummedCheckpointIO\n"
        f"state = torch.load({str(last)!r}, weights_only=False)\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({last.stat().st_size // 2}, resource.RLIM_INFINITY))\n"
        "try:\n"
        f"    ChecksummedCheckpointIO().save_checkpoint(state, {str(last)!r})\n"
        "except CheckpointError as err:\n"
        "    print(err)\n"
        "    sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"checkpoint {last} could not be written (torch.save failed: " in done.stdout, done.stdout
    assert "MiB free on its disk); nothing partial was left, and the one there before is unchanged" in done.stdout
    assert hashlib.sha256(last.read_bytes()).hexdigest() == before and verify(last) is not None
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt", "previous.ckpt"]


def test_resuming_from_previous_beside_a_damaged_last_does_not_keep_the_damaged_one(
    run: Path, model_dir: Path, batch: Any
) -> None:
    """What the refusal message advises; the first step's save must not keep the damaged ``last`` as previous.
    A temporary a killed write left behind is removed when the run starts."""
    folder = run / "checkpoints"
    _patch_middle(folder / "last.ckpt")
    (folder / ".last.ckpt.tmp").write_bytes((folder / "previous.ckpt").read_bytes()[:1000])  # as a kill leaves it
    fit(model_dir, batch, run, 3, TensorBoardLogger(run), ckpt_path=str(folder / "previous.ckpt"))
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "previous.ckpt"]
    stamps = [verify(folder / "previous.ckpt"), verify(folder / "last.ckpt")]
    assert [s.global_step for s in stamps if s is not None] == [2, 3]  # step 3 redone; previous is still step 2


def test_ckpt_path_rules(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``last`` with nothing to resume: fit says so in one line and starts at step 0, validate refuses; with
    checkpoints only elsewhere under the root (the old per-version layout) both refuse, naming the newest; a new
    run into a folder with checkpoints refuses (it would overwrite them)."""
    empty = tmp_path / "empty"
    assert resolve_ckpt_path("last", trainer(empty, False), fitting=True) is None
    folder = empty / "checkpoints"
    expected = f"roll_lightning: --ckpt_path last: no checkpoint in {folder} yet; starting a new run at step 0\n"
    assert capsys.readouterr().err == expected
    with pytest.raises(CheckpointError, match="no checkpoint in .* to evaluate"):
        resolve_ckpt_path("last", trainer(empty, False), fitting=False)

    legacy = tmp_path / "legacy" / "lightning_logs" / "version_0" / "checkpoints"
    legacy.mkdir(parents=True)
    shutil.copy(run / "checkpoints" / "last.ckpt", legacy / "last.ckpt")
    with pytest.raises(CheckpointError, match=f"has no last.ckpt, but .* the newest {legacy / 'last.ckpt'}"):
        resolve_ckpt_path("last", trainer(tmp_path / "legacy", False), fitting=True)

    with pytest.raises(CheckpointError, match=r"earlier run \(last.ckpt: rollout step 3\), which a new run would"):
        resolve_ckpt_path(None, trainer(run, False), fitting=True)
    assert resolve_ckpt_path(None, trainer(run, False), fitting=False) is None
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_ckpt_path(str(tmp_path / "nope.ckpt"), trainer(run, False), fitting=True)


def test_unstamped_checkpoints_written_before_still_load(run: Path) -> None:
    """A checkpoint saved by plain ``torch.save`` (this project before the stamp) is checked for completeness
    only, and loads."""
    old = run / "old.ckpt"
    torch.save(torch.load(run / "checkpoints" / "last.ckpt", weights_only=False), old)
    assert verify(old) is None
    assert ChecksummedCheckpointIO().load_checkpoint(old)["global_step"] == 3


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded-folders", "gathered-files"])
def test_fsdp2_checkpoints_resume_from_last_on_two_ranks(sharded: bool, model_dir: Path, tmp_path: Path) -> None:
    """`ModelParallelStrategy` writes its default sharded checkpoints itself (folders, moved to previous before
    the next is written; not checksummed) and gathered full ones through the plugin on rank 0 (stamped);
    ``last`` resumes from either, and a sharded folder whose write was cut short is named as incomplete."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    script = TESTS / "support" / "fsdp_checkpoints.py"
    done = subprocess.run(
        [sys.executable, str(script), str(model_dir), str(tmp_path), "1" if sharded else "0"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert report == {"resolved": str(last), "rollout_steps": 3, "global_step": 3}
    previous = tmp_path / "checkpoints" / "previous.ckpt"
    if sharded:
        assert (last / "meta.pt").is_file() and (previous / "meta.pt").is_file()
        assert torch.load(last / "meta.pt", weights_only=False)["global_step"] == 3
        assert torch.load(previous / "meta.pt", weights_only=False)["global_step"] == 2
        (last / "meta.pt").unlink()  # as a kill during the sharded write leaves it
        with pytest.raises(CheckpointError, match=f"{last} is incomplete: .* {previous} is intact"):
            resolve_ckpt_path("last", trainer(tmp_path, False), fitting=True)
    else:
        stamps = [verify(tmp_path / "checkpoints" / name) for name in ("previous.ckpt", "last.ckpt")]
        assert [s.global_step for s in stamps if s is not None] == [2, 3]


SIGTERM_DURING_WRITES = """
import signal, sys, torch
from pathlib import Path
from roll_lightning.checkpoints import write_checkpoint

def stop(signum, frame):  # as the rollout's SIGTERM handler does with no rollout in flight: exit where it lands
    raise SystemExit(128 + signum)

signal.signal(signal.SIGTERM, stop)
state = {"weights": [torch.randn(2000) for _ in range(3000)], "global_step": 0}  # many records: many writes
path = Path(sys.argv[1])
write_checkpoint(state, path)
print("ready", flush=True)
while True:
    state["global_step"] += 1
    write_checkpoint(state, path)
"""


@pytest.mark.parametrize("delay_s", [0.0, 0.03, 0.07, 0.15, 0.3])
def test_sigterm_during_writes_exits_as_sigterm_and_leaves_last_whole(delay_s: float, tmp_path: Path) -> None:
    """A SIGTERM handler that raises ``SystemExit`` runs wherever the signal lands, inside ``torch.save`` too.
    Through a Python file object torch masked it with its own error (exit 1) in a quarter of such drills, or lost
    it; the process must exit 143, the checkpoint there before whole and no temporary left."""
    path = tmp_path / "last.ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_DURING_WRITES, str(path)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(delay_s)  # somewhere in the endless writes: where exactly does not matter
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr.decode()[-3000:]
    assert verify(path) is not None and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
