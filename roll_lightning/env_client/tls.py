"""`speaks_tls`: whether the server at an address answers a TLS handshake, to tell a plaintext client talking to
a TLS server (or the reverse) in one message instead of a timeout. gRPC reports either as UNAVAILABLE."""

from __future__ import annotations

import asyncio
import ssl


async def speaks_tls(address: str, timeout_s: float = 2.0) -> bool | None:
    """True: the server completed a TLS handshake (its certificate is not checked here); False: it answered, but
    not with TLS; None: it could not be reached (down, still starting, a timeout)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port), ssl=context, ssl_handshake_timeout=timeout_s),
            timeout_s,
        )
    except ssl.SSLError:
        return False  # connected, and the bytes that came back were not a TLS handshake
    except (OSError, TimeoutError, ValueError):
        return None
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return True
