"""Network namespaces as stand-in "hosts" for multi-host tests (needs root and iproute2).

    with NetnsLab(3) as lab:                       # 3 namespaces on one bridge, reachable from this (root) ns
        server = lab.hosts[0].start_env_server(["frozenlake"])     # bound to the host's own address
        lab.hosts[0].cut()                         # pull the cable: packets vanish silently, no RST, no ICMP
        lab.hosts[0].restore()

Topology: a bridge in the root namespace holds the first address of a /24; each host is a namespace with a veth
pair, one end inside (its address, ``lo`` up), the other end a port of the bridge. The root namespace is on the
bridge's subnet itself, so no IP forwarding (no sysctl) is needed. Every name carries a random suffix and the
subnet is picked among unused ones, so parallel runs don't collide. Teardown (the context manager's exit) stops
the servers, deletes the veths, the bridge and the namespaces, even
after a failure, and reports what it could not remove.
"""

from __future__ import annotations

import ipaddress
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from roll_lightning.env_client.local import LocalServer, launch_local_server

IP = shutil.which("ip") or ("/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else None)


def netns_unavailable_reason() -> str | None:
    """Why namespaces can't be built here (None when they can)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    if IP is None:
        return "iproute2 ('ip') is not installed"
    return None


class IpCommandError(RuntimeError):
    pass


def ip(*args: str, check: bool = True, timeout: float = 10.0) -> str:
    """Run ``ip ARGS``; raises `IpCommandError` with the command and its stderr when it fails."""
    assert IP is not None, "iproute2 missing"
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise IpCommandError(f"`ip {' '.join(args)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


@dataclass
class Host:
    name: str  # the namespace
    address: str  # its IPv4 address on the lab bridge
    root_if: str  # the veth end in the root namespace (a bridge port)
    inner_if: str  # the veth end inside the namespace
    servers: list[LocalServer] = field(default_factory=list)

    def exec(self, *cmd: str, check: bool = True) -> str:
        return ip("netns", "exec", self.name, *cmd, check=check)

    def start_env_server(
        self,
        env_ids: Sequence[str],
        *,
        port: int = 50051,
        extra_args: Sequence[str] = (),
        ready_timeout_s: float = 60.0,
    ) -> LocalServer:
        """Start ``python -m env_servers serve`` in this namespace, bound to its address; waits for the ready line."""
        assert IP is not None
        server = launch_local_server(
            env_ids,
            host=self.address,
            port=port,
            extra_args=extra_args,
            ready_timeout_s=ready_timeout_s,
            prefix=[IP, "netns", "exec", self.name],  # `ip netns exec` execs: the pid is the server's own
        )
        self.servers.append(server)
        return server

    def cut(self) -> None:
        """Pull the cable: take the host's bridge port down. In-flight packets vanish (no RST, no ICMP)."""
        ip("link", "set", self.root_if, "down")

    def restore(self) -> None:
        ip("link", "set", self.root_if, "up")

    def stop_servers(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers.clear()


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    for line in ip("-4", "-o", "addr", "show").splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.ip_interface(parts[parts.index("inet") + 1]).network)
    for line in ip("-4", "route", "show", "table", "all").splitlines():
        first = line.split()[0] if line.split() else ""
        if first and first[0].isdigit():
            try:
                nets.append(ipaddress.ip_network(first, strict=False))
            except ValueError:
                pass
    return nets


def _pick_subnet() -> ipaddress.IPv4Network:
    used = _used_networks()
    candidates = [ipaddress.ip_network(f"10.231.{i}.0/24") for i in range(256)]
    random.shuffle(candidates)
    for net in candidates:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free 10.231.x.0/24 subnet for the netns lab")


class NetnsLab:
    """``n`` hosts (namespaces) on one bridge in the root namespace; a context manager that always cleans up."""

    def __init__(self, n: int, *, prefix: str = "rl") -> None:
        assert 1 <= n <= 9
        self.n = n
        self.tag = f"{prefix}{random.getrandbits(24):06x}"  # e.g. rl3fa9c1: 8 chars, names stay < 16 (IFNAMSIZ)
        self.bridge = f"{self.tag}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self.hosts: list[Host] = []
        self._namespaces: list[str] = []
        self._links: list[str] = []  # root-side links to delete (veths, then the bridge last)

    def __enter__(self) -> NetnsLab:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self.subnet = _pick_subnet()
        hosts_ip = list(self.subnet.hosts())
        self.gateway = str(hosts_ip[0])
        ip("link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for i in range(self.n):
            ns, root_if, inner_if = f"{self.tag}h{i}", f"{self.tag}v{i}", f"{self.tag}p{i}"
            address = str(hosts_ip[10 + i])
            ip("netns", "add", ns)
            self._namespaces.append(ns)
            ip("link", "add", root_if, "type", "veth", "peer", "name", inner_if)
            self._links.insert(0, root_if)
            ip("link", "set", inner_if, "netns", ns)
            ip("link", "set", root_if, "master", self.bridge)
            ip("link", "set", root_if, "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner_if)
            ip("-n", ns, "link", "set", inner_if, "up")
            self.hosts.append(Host(ns, address, root_if, inner_if))
        self._wait_reachable()

    def _wait_reachable(self, timeout: float = 10.0) -> None:
        """Wait until every host's link is up and its address answers a ping from the root namespace."""
        ping = shutil.which("ping")
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while True:
                state = ip("-n", host.name, "-br", "link", "show", host.inner_if).split()
                up = len(state) > 1 and state[1] == "UP"
                if up and ping:
                    up = subprocess.run([ping, "-c1", "-W1", host.address], capture_output=True).returncode == 0
                if up:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"netns host {host.name} ({host.address}) not reachable: {state}")
                time.sleep(0.05)

    def close(self) -> None:
        """Stop servers, delete veths, the bridge and the namespaces; raises at the end if anything is left."""
        problems = []
        for host in self.hosts:
            try:
                host.stop_servers()
            except Exception as err:  # keep tearing down
                problems.append(f"stopping servers in {host.name}: {err!r}")
        # Root-side links first: deleting a veth end deletes its peer at once, whereas a deleted namespace's
        # devices go away asynchronously (a later `ip link` could still list them, or race a delete).
        for link in self._links:
            try:
                ip("link", "del", link)
            except IpCommandError as err:
                if "Cannot find device" not in str(err):
                    problems.append(str(err))
        self._links.clear()
        for ns in self._namespaces:
            try:
                ip("netns", "del", ns)
            except IpCommandError as err:
                problems.append(str(err))
        self._namespaces.clear()
        deadline = time.monotonic() + 5.0
        while True:
            left = [n for n in ip("netns", "list").split() if n.startswith(self.tag)]
            left += [line for line in ip("-o", "link").splitlines() if self.tag in line]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if problems or left:
            raise RuntimeError(f"netns lab {self.tag} teardown incomplete: {problems} left: {left}")
