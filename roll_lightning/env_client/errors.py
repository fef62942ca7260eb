"""Env client errors. `EpisodeFailed` means the episode cannot go on; an env refusing a bad LLM reply is not an
error but a step with ``action_valid=False``."""

from __future__ import annotations

import grpc

# the server replays a resent request by request_id
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


class EpisodeFailed(Exception):
    """An env call failed for good; the episode must be abandoned."""

    def __init__(self, code: grpc.StatusCode, detail: str, *, endpoint: str = "", session_id: str = "") -> None:
        self.code = code
        self.detail = detail
        self.endpoint = endpoint
        self.session_id = session_id
        where = f" [{endpoint}{' ' + session_id if session_id else ''}]" if endpoint else ""
        super().__init__(f"{code.name}: {detail}{where}")

    @property
    def draining(self) -> bool:
        """The endpoint is shutting down: not worth retrying there, not the episode's fault."""
        return self.code == grpc.StatusCode.UNAVAILABLE and self.detail.startswith("draining")

    @property
    def infrastructure(self) -> bool:
        """The fault is the server's or the network's, not the request's."""
        return self.code in {
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.NOT_FOUND,  # an expired session: the server restarted or reaped it
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.CANCELLED,
        }


class ProtocolViolation(EpisodeFailed):
    """A server's answer breaks a rule of env.proto; training on it would corrupt the batch."""

    def __init__(self, detail: str, *, endpoint: str, session_id: str) -> None:
        super().__init__(grpc.StatusCode.INTERNAL, detail, endpoint=endpoint, session_id=session_id)


class EchoMismatch(ProtocolViolation):
    """A server answered with ids other than those asked for (env.proto, "Echoes"), typically from a replay
    cache keyed server-wide instead of per session."""

    def __init__(self, field: str, expected: object, got: object, *, endpoint: str, session_id: str) -> None:
        self.field, self.expected, self.got = field, expected, got
        super().__init__(
            f"the server's answer names {field}={got!r}, but the request was for {field}={expected!r} "
            "(a protocol violation: its replay cache may not be per session)",
            endpoint=endpoint,
            session_id=session_id,
        )


class NoEndpointAvailable(EpisodeFailed):
    """Every endpoint is full, draining, or ejected."""

    def __init__(self, detail: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, detail)


REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class EndpointRefused(NoEndpointAvailable):
    """An endpoint refused this client's credentials; raised at once, since waiting would not change the token."""

    def __init__(self, code: grpc.StatusCode, detail: str, *, endpoint: str) -> None:
        hint = "the bearer token is missing or wrong" if code == grpc.StatusCode.UNAUTHENTICATED else "not allowed"
        EpisodeFailed.__init__(self, code, f"env endpoint {endpoint} refused this client: {hint} ({detail})")
        self.endpoint = endpoint


class EndpointTlsMismatch(NoEndpointAvailable):
    """Client and endpoint disagree on TLS; raised at once instead of waiting out the start timeout."""

    def __init__(self, endpoint: str, server_tls: bool) -> None:
        if server_tls:
            detail = (
                f"env endpoint {endpoint} speaks TLS, and this client connects in plaintext: set "
                "data.envs.tls_root_cert to the PEM file of the certificate authority that signed its certificate"
            )
        else:
            detail = (
                f"env endpoint {endpoint} does not speak TLS, and this client connects with TLS "
                "(data.envs.tls_root_cert is set): start the server with --tls-cert and --tls-key, or unset it"
            )
        EpisodeFailed.__init__(self, grpc.StatusCode.UNAVAILABLE, detail)
        self.endpoint = endpoint


class StartTimedOut(NoEndpointAvailable):
    """No endpoint was reachable and serving within the pool's ``start_timeout_s``."""

    def __init__(self, seconds: float, addresses: list[str]) -> None:
        self.seconds, self.addresses = seconds, addresses
        super().__init__(f"no env endpoint is reachable and serving after {seconds:g}s: " + ", ".join(addresses))


class EnvOutage(NoEndpointAvailable):
    """Every endpoint has been down longer than ``outage_timeout_s``: stop, don't retry."""


class EpisodesKeepFailing(RuntimeError):
    """``rollout.max_failed_groups_in_a_row`` groups in a row were dropped: stop instead of spinning."""


def status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
