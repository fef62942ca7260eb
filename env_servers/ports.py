"""`free_port`: a TCP port to name before a server starts (conformance runs, tests, benchmarks)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now; another process may take it before it is used, so callers retry on a clash."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
