"""A run resumed on another number of ranks (docs/reliability.md, "Resume on another number of ranks"): FSDP2 over
gloo ranks on the CPU, the front door's ``fit ... --ckpt_path last`` with a different ``--trainer.devices``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from support.cli import TINY, dumped_groups, run_cli
from support.group_record import recorded

from roll_lightning.rollout.scheduling.ledger import GroupSequence

SHARDED = [
    "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
    "--trainer.strategy.tensor_parallel_size", "1", "--trainer.strategy.process_group_backend", "gloo",
]  # fmt: skip
RUN = [
    "--trainer.callbacks+=support.group_record.GroupRecord",  # every rank's trained groups (the dump: rank 0's)
    "--data.rollout.batch_size", "4",
    "--data.rollout.max_staleness", "1",  # groups run ahead of the update: a checkpoint holds started, unsettled ones
    "--model.algorithm.entropy_coef", "0.01",  # every update steps the optimiser: its state has to be resharded
]  # fmt: skip


def ranks_args(ranks: int, plain: bool) -> list[str]:
    """``plain``: one process, Lightning's default strategy (a full-file checkpoint); else FSDP2 on ``ranks``."""
    if plain:
        return ["--trainer.devices", "1"]
    return ["--trainer.devices", str(ranks), *SHARDED, "--trainer.strategy.data_parallel_size", str(ranks)]


def ledger_states(checkpoint: Path) -> list[dict[str, Any]]:
    """Each rank's saved rollout state (a sharded checkpoint keeps it in ``meta.pt``)."""
    path = checkpoint / "meta.pt" if checkpoint.is_dir() else checkpoint
    return torch.load(path, weights_only=False, map_location="cpu")["RolloutDataModule"]["ranks"]


def owed_and_settled(states: list[dict[str, Any]]) -> tuple[set[int], set[int]]:
    """What a resume must play (started, unsettled, or skipped below the highest started) and what it must not."""
    sequences = []
    for state in states:
        (lane,) = state["lanes"].values()
        seq = GroupSequence()
        seq.load_state_dict(lane)
        sequences.append(seq)
    started = {seq.index(k) for seq in sequences for k in range(seq.next_local)}
    started |= {i for seq in sequences for i in seq.adopted}
    unsettled = {i for seq in sequences for i in seq.unsettled()}
    top = max(started, default=-1)
    return set(range(top + 1)) - (started - unsettled), started - unsettled


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3)], ids=["2-to-1", "1-to-2", "2-to-3"])
def test_a_run_resumes_on_another_number_of_ranks_with_every_group_once(
    tmp_path: Path, before: int, after: int
) -> None:
    """Two rollout steps on ``before`` ranks, then ``--ckpt_path last`` on ``after`` ranks to step 4: the first line
    says so; no group is trained twice; every group the first run owed (started and not trained) is trained by
    one new rank or still owed in the new checkpoint; the trajectory dump and the step count go on."""
    root = tmp_path / "run"
    common = ["--config", TINY, "--trainer.default_root_dir", str(root), *RUN]
    first = run_cli("fit", *common, *ranks_args(before, plain=before == 1), "--model.rollout_steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    owed, settled = owed_and_settled(ledger_states(root / "checkpoints" / "last.ckpt"))
    assert owed, "the first run left groups started (run ahead of its update) for the resume to play"

    # the 1-rank side of a sharded run keeps the sharded strategy, on one device
    second = run_cli(
        "fit", *common, *ranks_args(after, plain=False), "--model.rollout_steps", "4", "--ckpt_path", "last",
        cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    start = second.stdout.splitlines()[0]
    assert f"resuming after step 2 saved on {before} rank{'s' * (before > 1)}, here on {after}" in start, start

    records = recorded(root)
    assert sorted((r["step"], r["ranks"]) for r in records) == sorted(
        [(s, before) for s in (1, 2) for _ in range(before)] + [(s, after) for s in (3, 4) for _ in range(after)]
    ), "every rank of each run trained each of its steps"
    trained = [int(g.split("/")[1][1:]) for r in records for g in r["groups"]]
    assert len(trained) == len(set(trained)), "no group trained twice"
    first_run = {int(g.split("/")[1][1:]) for r in records if r["step"] <= 2 for g in r["groups"]}
    resumed = set(trained) - first_run
    assert first_run <= settled and not resumed & settled
    final = ledger_states(root / "checkpoints" / "last.ckpt")
    assert len(final) == after and {s["world_size"] for s in final} == {after}
    still_owed, _ = owed_and_settled(final)
    assert owed <= resumed | still_owed, "every owed group played by the new ranks or kept for the next resume"
    assert sorted(dumped_groups(root)) == [1, 2, 3, 4]  # the dump goes on where the first run stopped
    if after == 1:  # evaluation on another panel of held-out boards: the training position is not checked
        other = run_cli(
            "validate", *common, *ranks_args(1, plain=False), "--ckpt_path", "last", "--seed_everything", "7",
            "--data.evaluation.episodes", "4", cwd=tmp_path,
        )  # fmt: skip
        assert other.returncode == 0, other.stderr[-3000:]
        assert "eval/success_rate" in other.stdout


def test_a_sharded_checkpoint_and_a_strategy_that_reads_only_files_are_named_in_one_line(tmp_path: Path) -> None:
    """A folder checkpoint (complete: its ``meta.pt`` is there) met by Lightning's default single-device strategy,
    which would fail deep in the load: refused before anything starts, naming the strategy that reads it."""
    import lightning as L

    from roll_lightning.checkpoints import CheckpointError, resolve_ckpt_path

    folder = tmp_path / "checkpoints" / "last.ckpt"
    folder.mkdir(parents=True)
    torch.save({"global_step": 1}, folder / "meta.pt")
    trainer = L.Trainer(accelerator="cpu", devices=1, default_root_dir=tmp_path, logger=False)
    with pytest.raises(CheckpointError, match="is a sharded folder, which SingleDeviceStrategy cannot read") as err:
        resolve_ckpt_path("last", trainer, fitting=True)
    assert "--trainer.strategy lightning.pytorch.strategies.ModelParallelStrategy" in str(err.value)
