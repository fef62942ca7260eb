"""The one exception the rollout has to handle from the env client.

An env *refusing a bad LLM reply* is not an error (it is a normal step with ``action_valid=False``).
`EpisodeFailed` means the episode cannot go on: the server is gone or unreachable, the deadline passed, the
env crashed, or the request was refused. The rollout retries the episode on a fresh session with the same seed
and drops the whole group when retries run out; it never trains on a partial episode.
"""

from __future__ import annotations

import grpc

# Codes after which the same request may be sent again (the server replays it by request_id).
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE})


class EpisodeFailed(Exception):
    """An env call failed for good (after any retries); the episode must be abandoned.

    Attributes: ``code`` (a `grpc.StatusCode`), ``endpoint`` (``host:port``), ``session_id`` (may be empty)
    and ``detail`` (the server's or transport's message).
    """

    def __init__(self, code: grpc.StatusCode, detail: str, *, endpoint: str = "", session_id: str = "") -> None:
        self.code = code
        self.detail = detail
        self.endpoint = endpoint
        self.session_id = session_id
        where = f" [{endpoint}{' ' + session_id if session_id else ''}]" if endpoint else ""
        super().__init__(f"{code.name}: {detail}{where}")

    @property
    def draining(self) -> bool:
        """The endpoint refused new work because it is shutting down (env.proto: UNAVAILABLE, "draining..."):
        not worth retrying there, and not the episode's fault."""
        return self.code == grpc.StatusCode.UNAVAILABLE and self.detail.startswith("draining")

    @property
    def infrastructure(self) -> bool:
        """True when the fault is the server's or the network's, not the request's."""
        return self.code in {
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.INTERNAL,
            grpc.StatusCode.NOT_FOUND,  # an expired session: the server restarted or reaped it
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.CANCELLED,
        }


class ProtocolViolation(EpisodeFailed):
    """A server's answer breaks a rule of env.proto (its ids, its images): the episode is abandoned (and replayed
    elsewhere), since training on it would corrupt the batch. Code INTERNAL; the message names the rule."""

    def __init__(self, detail: str, *, endpoint: str, session_id: str) -> None:
        super().__init__(grpc.StatusCode.INTERNAL, detail, endpoint=endpoint, session_id=session_id)


class EchoMismatch(ProtocolViolation):
    """A server answered with ids that are not the ones asked for (env.proto, "Echoes"): another session's
    episode, the wrong step or seed. Typically a replay cache keyed by request_id server-wide instead of per
    session. The episode is abandoned (and replayed elsewhere): training on it would corrupt the batch.

    Attributes (besides `EpisodeFailed`'s): ``field`` (e.g. ``"episode_id"``), ``expected`` and ``got``.
    """

    def __init__(self, field: str, expected: object, got: object, *, endpoint: str, session_id: str) -> None:
        self.field, self.expected, self.got = field, expected, got
        super().__init__(
            f"the server's answer names {field}={got!r}, but the request was for {field}={expected!r} "
            "(a protocol violation: its replay cache may not be per session)",
            endpoint=endpoint,
            session_id=session_id,
        )


class NoEndpointAvailable(EpisodeFailed):
    """No endpoint can take a new session: every one is full, draining, or ejected as unhealthy."""

    def __init__(self, detail: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, detail)


REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


class EndpointRefused(NoEndpointAvailable):
    """An endpoint refused this client's credentials (UNAUTHENTICATED or PERMISSION_DENIED).

    Raised by `EnvPool.start` as soon as an endpoint answers so: waiting would not change the token, so the
    caller is told at once which endpoint refused and why, instead of "not reachable" after the start timeout.
    """

    def __init__(self, code: grpc.StatusCode, detail: str, *, endpoint: str) -> None:
        hint = "the bearer token is missing or wrong" if code == grpc.StatusCode.UNAUTHENTICATED else "not allowed"
        EpisodeFailed.__init__(self, code, f"env endpoint {endpoint} refused this client: {hint} ({detail})")
        self.endpoint = endpoint


class EndpointTlsMismatch(NoEndpointAvailable):
    """An endpoint speaks TLS and this client plaintext, or the other way round: known at the first connection
    (`tls.speaks_tls`), so `EnvPool.start` says so at once instead of waiting out its start timeout."""

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


class EnvOutage(NoEndpointAvailable):
    """Every endpoint has been down (unreachable, ejected or draining) for longer than the pool waits out.

    Not an episode's fault, so not retried: the rollout stops with this message, which names the endpoints,
    how long they have been down and what each last answered.
    """


class EpisodesKeepFailing(RuntimeError):
    """``rollout.max_failed_groups_in_a_row`` groups in a row were dropped because their episodes kept failing
    (an env that crashes on every seed, a server that keeps timing out): the rollout stops instead of spinning."""


def status_code(number: int) -> grpc.StatusCode:
    """The `grpc.StatusCode` for a numeric code carried in a per-item Status."""
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN
