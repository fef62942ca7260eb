"""`speaks_tls`: whether a server answers a TLS handshake, to report a TLS mismatch that gRPC reports as
UNAVAILABLE."""

from __future__ import annotations

import asyncio
import ssl


async def speaks_tls(address: str, timeout_s: float = 2.0) -> bool | None:
    """True: a TLS handshake (certificate unchecked); False: an answer, not TLS; None: unreachable."""
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
        return False
    except (OSError, TimeoutError, ValueError):
        return None
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return True
