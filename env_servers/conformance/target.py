"""The suite's view of a server: raw stubs and the sessions it opened.

Each check's sessions are closed when it ends, so a server with a small ``--max-sessions`` passes every check.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc

from roll_lightning.protocol.v1 import env_pb2 as pb
from roll_lightning.protocol.v1 import env_pb2_grpc as pb_grpc

SERVICE = pb.DESCRIPTOR.services_by_name["EnvService"].full_name
CODE = {code.value[0]: code for code in grpc.StatusCode}
KNOWN_CAPABILITIES = ("batch", "batch-mixed", "stream", "images", "tools", "fork")


class CheckFailed(AssertionError):
    """The server broke the rule the check is about; the message says how."""


class Skipped(Exception):  # noqa: N818 (an outcome, not an error)
    """The rule does not apply to this server, or needs a suite option."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def expect_code(got: tuple[grpc.StatusCode, str], want: grpc.StatusCode, what: str) -> None:
    expect(got[0] == want, f"{what}: expected {want.name}, got {got[0].name} ({got[1]!r})")


def rid() -> str:
    return uuid.uuid4().hex


@dataclass
class Target:
    """One server endpoint and the env under test."""

    address: str
    env_id: str
    config: dict[str, Any] = field(default_factory=dict)
    token: str | None = None
    timeout: float = 30.0
    opened: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None

    def call(self, method: str, request: Any, timeout: float | None = None, metadata: Any = "default") -> Any:
        metadata = self.metadata if metadata == "default" else metadata
        return getattr(self.stub, method)(request, timeout=timeout or self.timeout, metadata=metadata)

    def refused(self, method: str, request: Any, timeout: float | None = None, metadata: Any = "default") -> Any:
        """The status code and message of a call that must fail."""
        try:
            self.call(method, request, timeout, metadata)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
        raise CheckFailed(f"{method} succeeded but should have been refused")

    def info(self) -> pb.ServerInfo:
        return self.call("GetServerInfo", pb.GetServerInfoRequest())

    def create_request(self, request_id: str | None = None) -> pb.CreateSessionRequest:
        request = pb.CreateSessionRequest(env_id=self.env_id, request_id=rid() if request_id is None else request_id)
        request.config.update(self.config)
        return request

    def open(self, request_id: str | None = None) -> str:
        session_id = self.call("CreateSession", self.create_request(request_id)).session_id
        self.opened.append(session_id)
        return session_id

    def reset(self, session_id: str, seed: int | None, request_id: str | None = None) -> pb.ResetResult:
        request = pb.ResetRequest(session_id=session_id, request_id=rid() if request_id is None else request_id)
        if seed is not None:
            request.seed = seed
        return self.call("Reset", request)

    def step(self, session_id: str, episode_id: str, index: int, text: str, request_id: str = "") -> pb.StepResult:
        return self.call("Step", step_request(session_id, episode_id, index, text, request_id or rid()))

    def close_opened(self) -> None:
        """Close what the last check opened, best effort."""
        for session_id in self.opened:
            try:
                self.call("CloseSession", pb.CloseSessionRequest(session_id=session_id), timeout=5.0)
            except grpc.RpcError:
                pass
        self.opened.clear()

    def close(self) -> None:
        self.close_opened()
        self.channel.close()


def step_request(session: str, episode: str, index: int, text: str = "x", request_id: str = "") -> pb.StepRequest:
    return pb.StepRequest(
        session_id=session,
        episode_id=episode,
        step_index=index,
        action=pb.Action(text=text),
        request_id=request_id or rid(),
    )


@dataclass
class Suite:
    """What every check gets: the server, the env's spec and the run's options."""

    t: Target
    spec: pb.EnvSpec
    info: pb.ServerInfo
    second: Target | None = None
    garbage: str = "\u2603 not an action at all \u2603"  # "" skips that rule
    crash_action: str | None = None
    launched: Any = None  # --launch's process
    loading_states: list[str] = field(default_factory=list)

    def needs_determinism(self, what: str) -> None:
        """Skip a rule that compares two runs of one seed: an env that declares ``deterministic: false`` may
        differ between them by design."""
        if not self.spec.deterministic:
            raise Skipped(f"the env declares deterministic: false, so {what} cannot be checked")

    def needs(self, capability: str) -> None:
        if capability not in self.info.capabilities:
            offered = list(self.info.capabilities)
            raise Skipped(f"the server does not advertise {capability!r} (capabilities: {offered})")
