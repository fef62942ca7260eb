"""`speaks_tls`: the answer against real servers, and a server that never closes cannot hold the probe."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading

import trustme
from support.servers import start_server

from roll_lightning.env_client.tls import speaks_tls


def _tls_files(ca: trustme.CA) -> dict[str, bytes]:
    cert = ca.issue_cert("env-host.test")
    chain = cert.cert_chain_pems[0].bytes() + b"".join(p.bytes() for p in cert.cert_chain_pems[1:])
    return {"tls_cert": chain, "tls_key": cert.private_key_pem.bytes()}


async def test_the_probe_tells_a_tls_server_from_a_plaintext_one_and_from_none() -> None:
    secure = start_server(**_tls_files(trustme.CA()))
    plain = start_server()
    try:
        for _ in range(4):  # the close after a handshake used to wait 30 s, in some probes only
            assert await asyncio.wait_for(speaks_tls(secure.address), 20) is True  # a hang guard, not a speed bound
            assert await asyncio.wait_for(speaks_tls(plain.address), 20) is False
    finally:
        secure.stop()
        plain.stop()
    with socket.socket() as free:  # a port nobody listens on
        free.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{free.getsockname()[1]}"
    assert await speaks_tls(address, timeout_s=1.0) is None


async def test_a_server_that_never_answers_the_close_does_not_hold_the_probe() -> None:
    """The server completes the handshake, then neither reads nor closes: TLS's closing exchange never ends."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    trustme.CA().issue_cert("env-host.test").configure_cert(context)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[ssl.SSLSocket] = []
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        held.append(context.wrap_socket(conn, server_side=True))  # the handshake; then silence
        done.wait()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert await asyncio.wait_for(speaks_tls(address, timeout_s=2.0), 20) is True  # a hang guard
    finally:
        done.set()
        thread.join(timeout=10)
        for conn in held:
            conn.close()
        listener.close()
