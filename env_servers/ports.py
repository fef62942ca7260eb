"""`free_port`: a TCP port to name before a server starts (conformance runs, tests, benchmarks); `check_bindable`:
one line naming the port when a server could not listen on it."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now; another process may take it before it is used, so callers retry on a clash."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_bindable(host: str, port: int) -> None:
    """Raise an OSError naming ``host:port`` when nothing could listen there now (in use, or not this host's
    address); gRPC's own bind failure is a log line and an unnamed error."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family) as sock:
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
        )  # as the servers bind: past TIME_WAIT, not a listener
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
