"""Beyond one machine: ``fit`` as two nodes (two processes with ``NODE_RANK`` 0 and 1 and node 0's address, as a
cluster launcher starts them; each node a network namespace where root allows), each node with its own engine
and its own env servers, FSDP2 over gloo across the nodes.

A SIGTERM to one node stops both at the same step (before, both waited forever: Lightning's notifier broadcast
from inside the signalled node's handler), both write that step's checkpoint together though none is due (every
100 steps), and ``--ckpt_path last`` on both resumes exactly: the same groups, step by step, as a run never
stopped. That the update equals one process's: tests/training/test_fsdp.py (two nodes)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from support.cli import SPARSE_CHECKPOINTS, TINY, children, dumped_groups, wait_for_file
from support.nodes import TWO_NODES, finish, start_nodes, two_hosts

from env_servers.ports import free_port
from roll_lightning.env_client.local import launch_local_server
from roll_lightning.rollout.scheduling.ledger import group_seed

pytestmark = pytest.mark.timeout(900)
STEPS = 5


def args(run: Path, *more: str) -> list[str]:
    return [
        "fit", "--config", TINY, *TWO_NODES, "--model.rollout_steps", str(STEPS),
        "--trainer.default_root_dir", str(run), "--trainer.logger", "CSVLogger",
        "--trainer.logger.save_dir", str(run),
        "--trainer.callbacks+=roll_lightning.callbacks.TrajectoryDump", "--trainer.callbacks.every_n_steps", "1",
        "--trainer.callbacks.max_episodes", "0", *SPARSE_CHECKPOINTS, *more,
    ]  # fmt: skip


def rank_states(run: Path) -> list[dict]:
    meta = torch.load(run / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=False)
    assert meta["rollout_steps"] == STEPS
    return meta["RolloutDataModule"]["ranks"]


def test_a_sigterm_to_one_node_stops_both_and_both_resume_exactly(tmp_path: Path) -> None:
    with two_hosts() as nodes:
        # the run never stopped, for reference
        reference = tmp_path / "reference"
        for status, stderr in finish(start_nodes(nodes, args(reference), tmp_path / "ref")):
            assert status == 0, stderr[-3000:]

        run = tmp_path / "run"
        procs = start_nodes(nodes, args(run), tmp_path)
        assert wait_for_file(run, "step_000002.jsonl", procs[0]), finish(procs)[0][1][-3000:]
        assert all(children(p.pid) for p in procs)  # each node runs its own env servers
        procs[1].send_signal(signal.SIGTERM)  # node 1 only
        stopped = finish(procs, timeout=120)  # a hang guard: both nodes must leave
        for status, stderr in stopped:
            assert status == 128 + signal.SIGTERM, stderr[-3000:]
            assert stderr.rstrip().endswith("roll_lightning: stopped by SIGTERM; resume with --ckpt_path last")
        stopped_after = len(dumped_groups(run))
        assert stopped_after < STEPS
        held = torch.load(run / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=False)["rollout_steps"]
        assert held == stopped_after and not (run / "checkpoints" / "previous.ckpt").exists()  # written at the stop

        for status, stderr in finish(start_nodes(nodes, args(run, "--ckpt_path", "last"), tmp_path)):
            assert status == 0, stderr[-3000:]

    # node 0's groups, step by step, are the reference's; so is each rank's place in its group sequence
    assert dumped_groups(run) == dumped_groups(reference)
    assert sorted(dumped_groups(run)) == list(range(1, STEPS + 1))
    states, expected = rank_states(run), rank_states(reference)
    assert states == expected
    # the ranks played disjoint groups: rank r takes every other group index, from r
    trained = [
        {group_seed(0, local * 2 + rank) for local in range(states[rank]["lanes"]["frozenlake"]["next_local"])}
        for rank in (0, 1)
    ]
    assert trained[0] and trained[1] and not trained[0] & trained[1]
    dumped = {int(g.split("/s")[1]) for step in dumped_groups(run).values() for g in step}
    assert dumped == trained[0]


def test_when_one_node_fails_for_good_the_other_stops_at_the_same_step_in_one_line(tmp_path: Path) -> None:
    """Node 1's only env server dies and its outage timeout (3 s) ends its run: node 0 stops at that step too,
    saying why in one line, instead of waiting in a collective for a rank that left; both write the last step
    they trained (no checkpoint was due)."""
    with two_hosts() as nodes:
        server = launch_local_server(["frozenlake"], prefix=nodes[1].prefix)  # on node 1's host, its only one
        run = tmp_path / "run"
        remote = ["--data.envs.endpoints", f'["{server.address}"]', "--data.envs.outage_timeout_s", "3"]
        procs = start_nodes(nodes, args(run, "--model.rollout_steps", "1000"), tmp_path, more={1: remote})
        try:
            assert wait_for_file(run, "step_000002.jsonl", procs[0]), finish(procs)[0][1][-3000:]
        finally:
            server.process.kill()
            server.stop()
        (status0, stderr0), (status1, stderr1) = finish(procs, timeout=120)
    assert status1 == 1 and "every env endpoint has been down for 3s" in stderr1.splitlines()[-1], stderr1[-3000:]
    assert status0 == 1, stderr0[-3000:]
    assert stderr0.splitlines()[-1] == (
        "roll_lightning: error: another rank's rollout failed (its log says why); this rank stops with it; "
        "every step all ranks completed is checkpointed: resume with --ckpt_path last"
    )
    assert "Traceback" not in stderr0
    held = torch.load(run / "checkpoints" / "last.ckpt" / "meta.pt", weights_only=False)["rollout_steps"]
    assert held == len(dumped_groups(run)) >= 2


def test_when_one_node_fails_during_set_up_the_other_says_so_in_one_line(tmp_path: Path) -> None:
    """Node 1 is given an env endpoint nobody serves, so its set-up fails (its start waits 2 s for a serving
    endpoint) while node 0 waits in a collective: node 0 ends with one line that points at the other rank, not
    gloo's traceback."""
    with two_hosts() as nodes:
        dead = ["--data.envs.endpoints", f'["127.0.0.1:{free_port()}"]', "--data.envs.start_timeout_s", "2"]
        procs = start_nodes(nodes, args(tmp_path / "run"), tmp_path, more={1: dead})
        (status0, stderr0), (status1, stderr1) = finish(procs, timeout=180)
    assert status1 != 0 and "roll_lightning: error:" in stderr1.splitlines()[-1], stderr1[-3000:]
    assert status0 == 1, stderr0[-3000:]
    assert stderr0.splitlines()[-1] == (
        "roll_lightning: error: another rank's process ended while this one waited for it in a collective (its log "
        "says why); this rank stops with it; every step all ranks completed is checkpointed: resume with "
        "--ckpt_path last"
    )
    assert "Traceback" not in stderr0
