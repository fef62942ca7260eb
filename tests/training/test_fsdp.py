"""The same rollout batch gives the same update on 1 process and on 2 FSDP2 ranks (gloo, run as subprocesses, on
one node or as two nodes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_module import fit

from env_servers.ports import free_port
from roll_lightning.checks.handmade import handmade_batch
from roll_lightning.training import AlgorithmConfig, OptimConfig
from roll_lightning.training.module import AgentRLModule

TESTS = Path(__file__).parent.parent


@pytest.mark.parametrize(
    ("algorithm", "nodes", "turns"),
    [
        ({"estimator": "grpo"}, 1, 1),
        ({"estimator": "grpo", "loss": "gspo"}, 1, 1),
        ({"estimator": "grpo"}, 2, 1),
        ({"estimator": "grpo", "norm_by_std": False}, 1, 3),  # configs/frozenlake_vllm.yaml's update
    ],
    ids=["ppo", "gspo", "ppo-two-nodes", "grpo-trajectory-rows"],
)
def test_two_fsdp2_ranks_match_one_process(
    model_dir: Path, tokenizer: Any, tmp_path: Path, algorithm: dict[str, Any], nodes: int, turns: int
) -> None:
    """``nodes``: the two ranks on one node (Lightning starts the second) or on two (``NODE_RANK`` 0 and 1);
    ``turns``: each row a conversation of that many turns."""
    single = AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(**algorithm), optim=OptimConfig(lr=1e-3))
    fit(single, handmade_batch(model_dir, tokenizer, turns=turns), tmp_path / "single")

    out = tmp_path / "fsdp.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "roll_lightning.checks.fsdp_worker", str(model_dir), str(out)]
    command_tail = ["--turns", str(turns)]
    if nodes == 1:
        done = subprocess.run(
            [*command, json.dumps(algorithm), *command_tail],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    else:  # one process per node, as a cluster launcher starts them
        port = str(free_port())
        nodes_env = [{**env, "NODE_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in (0, 1)]
        procs = [
            subprocess.Popen(
                [*command, json.dumps(algorithm), "--nodes", "2", *command_tail],
                env=e,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
            )
            for e in nodes_env
        ]
        for proc in procs:
            _, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, stderr[-4000:]
    sharded = torch.load(out)
    expected = single.actor.state_dict()
    assert set(sharded) == set(expected)
    original = AgentRLModule._load(model_dir).state_dict()
    moved = sum(not torch.equal(expected[k], original[k]) for k in expected)
    assert moved > len(expected) // 2  # the update touched most tensors
    for name, tensor in expected.items():
        delta = (sharded[name] - tensor).abs().max().item()
        moved_by = (tensor - original[name]).abs().max().item()
        assert delta <= 1e-5 + 1e-3 * moved_by, f"{name}: differs by {delta:.2e}; the update moved it {moved_by:.2e}"


@pytest.mark.parametrize("batch_adjust", ["none", "copy", "delete"])
def test_ranks_with_different_row_counts_take_the_same_steps(
    model_dir: Path, tmp_path: Path, batch_adjust: str
) -> None:
    """Rank 0 holds 4 rows, rank 1 one (as dynamic sampling or step rows leave them): both take exactly
    ppo_epochs x mini_batches optimiser steps, and each step the same number of FSDP2 forward/backward passes
    (one micro-batch per row here), so no collective waits forever. Before, rank 1 took fewer steps and passes
    than rank 0 and the run deadlocked."""
    algorithm = {"mini_batches": 2, "ppo_epochs": 2, "micro_batching": "fixed", "micro_batch_size": 1}
    out = tmp_path / "fsdp.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            sys.executable, "-m", "roll_lightning.checks.fsdp_worker", str(model_dir), str(out),
            json.dumps({**algorithm, "batch_adjust": batch_adjust}), "--rank1-rows", "1",
        ],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,  # a hang guard: a deadlock fails here
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [int(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    assert steps == [4, 4]
    original = AgentRLModule._load(model_dir).state_dict()
    assert any(not torch.equal(t, original[k]) for k, t in torch.load(out).items()), "the update moved weights"


def test_an_update_too_far_is_undone_on_every_rank(model_dir: Path, tmp_path: Path) -> None:
    """`max_update_kl` under FSDP2: the KL is summed over both ranks' tokens, both ranks undo alike (a rank that
    did not would hang the next collective), and the gathered weights are the original ones, bit for bit."""
    out = tmp_path / "fsdp.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    algorithm = {"estimator": "grpo", "max_update_kl": 1e-12, "mini_batches": 2}
    done = subprocess.run(
        [sys.executable, "-m", "roll_lightning.checks.fsdp_worker", str(model_dir), str(out), json.dumps(algorithm)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,  # a hang guard
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    original = AgentRLModule._load(model_dir).state_dict()
    for name, tensor in torch.load(out).items():
        assert torch.equal(tensor, original[name]), name


def test_an_update_resumed_on_three_ranks_from_two_equals_one_process_resumed_from_the_same_checkpoint(
    model_dir: Path, tmp_path: Path
) -> None:
    """Elastic resume's training side: one step on 2 FSDP2 ranks, its sharded checkpoint (weights and Adam's
    moments, each rank's shard) resumed on 3 ranks for a second step; the same checkpoint resumed by one process
    for that step on the same 6 groups gives the same weights."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    algorithm = json.dumps({"estimator": "grpo"})
    checkpoint = tmp_path / "after-one-step.ckpt"

    def worker(ranks: int, out: Path, *more: str) -> None:
        command = [sys.executable, "-m", "roll_lightning.checks.fsdp_worker", str(model_dir), str(out), algorithm]
        done = subprocess.run(
            [*command, "--ranks", str(ranks), "--groups", "6", *more],
            env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]

    worker(2, tmp_path / "two.pt", "--save", str(checkpoint))
    assert (checkpoint / "meta.pt").is_file()  # sharded: each of the 2 ranks wrote its part
    worker(3, tmp_path / "three.pt", "--resume", str(checkpoint))
    worker(1, tmp_path / "one.pt", "--resume", str(checkpoint))
    assert [Path(f"{tmp_path / 'three.pt'}.rank{r}").read_text() for r in range(3)] == ["2"] * 3  # two steps
    before, three, one = (torch.load(tmp_path / name) for name in ("two.pt", "three.pt", "one.pt"))
    assert sum(not torch.equal(one[k], before[k]) for k in one) > len(one) // 2  # the second step moved most
    for name, tensor in one.items():
        delta = (three[name] - tensor).abs().max().item()
        moved_by = (tensor - before[name]).abs().max().item()
        assert delta <= 1e-5 + 1e-3 * moved_by, f"{name}: differs by {delta:.2e}; the step moved it {moved_by:.2e}"
