"""Two-node runs as a cluster launcher starts them: one ``python -m roll_lightning`` per node with ``NODE_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, each node in its own network namespace (a host of `support.netns`) where
root allows, else both on this host's loopback. Each node has its own working folder (its model cache, its env
servers); the run folder is shared, as a cluster's shared filesystem is."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from env_servers.ports import free_port
from support.cli import cli_env
from support.netns import IP, NetnsLab, netns_unavailable_reason

TWO_NODES = [  # FSDP2 over gloo, one rank per node
    "--trainer.num_nodes", "2", "--trainer.devices", "1",
    "--trainer.strategy", "lightning.pytorch.strategies.ModelParallelStrategy",
    "--trainer.strategy.data_parallel_size", "2", "--trainer.strategy.tensor_parallel_size", "1",
    "--trainer.strategy.process_group_backend", "gloo",
]  # fmt: skip


@dataclass
class Node:
    rank: int
    address: str  # where the other node reaches it
    prefix: list[str]  # runs a command on this "host"
    interface: str | None  # the network interface gloo must use (in a namespace)


@contextmanager
def two_hosts() -> Iterator[list[Node]]:
    """Two network namespaces on one bridge, or (without root) this host twice."""
    if netns_unavailable_reason() is not None:
        yield [Node(r, "127.0.0.1", [], None) for r in range(2)]
        return
    with NetnsLab(2) as lab:
        assert IP is not None
        yield [Node(r, h.address, [IP, "netns", "exec", h.name], h.inner_if) for r, h in enumerate(lab.hosts)]


def start_nodes(
    nodes: list[Node], args: list[str], tmp: Path, more: dict[int, list[str]] | None = None
) -> list[subprocess.Popen[str]]:
    """``python -m roll_lightning ARGS`` on every node, each in ``tmp/node<rank>``, node 0 the master (``more``:
    further arguments for some nodes, by rank)."""
    port = free_port()  # gloo's rendezvous on node 0's address
    started = []
    for node in nodes:
        cwd = tmp / f"node{node.rank}"
        cwd.mkdir(parents=True, exist_ok=True)
        env = cli_env(cwd, NODE_RANK=str(node.rank), MASTER_ADDR=nodes[0].address, MASTER_PORT=str(port))
        if node.interface is not None:
            env["GLOO_SOCKET_IFNAME"] = node.interface
        started.append(
            subprocess.Popen(
                [*node.prefix, sys.executable, "-m", "roll_lightning", *args, *(more or {}).get(node.rank, [])],
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a signal to one node reaches that node only
            )
        )
    return started


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[tuple[int, str]]:
    """Each node's exit status and stderr (``timeout``: a hang guard)."""
    out = []
    for proc in procs:
        try:
            _, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        out.append((proc.returncode, stderr))
    return out
