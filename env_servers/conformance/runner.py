"""Running the suite: connect (or launch the server), describe the env, run the checks, report each outcome.

Nothing becomes a traceback: whatever goes wrong is one FAIL line naming it.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from env_servers.conformance.target import SERVICE, CheckFailed, Skipped, Suite, Target
from env_servers.ports import free_port
from roll_lightning.protocol.v1 import env_pb2 as pb


@dataclass(frozen=True)
class CheckResult:
    status: str  # "PASS", "FAIL" or "SKIP"
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"


def _launch(command: str, timeout: float) -> tuple[subprocess.Popen[str], str, list[str], IO[str]]:
    """Start ``command`` ({port} = a free port) and watch its health until SERVING: the process, its address,
    the states seen on the way, and its stderr (a file, whose last line `_check_launched` quotes)."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    process = subprocess.Popen(
        shlex.split(command.replace("{port}", str(port))), stdout=subprocess.DEVNULL, stderr=log, text=True
    )
    address, states = f"127.0.0.1:{port}", []
    channel = grpc.insecure_channel(address)
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=1.0)
                state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            except grpc.RpcError as err:
                state = "unreachable" if err.code() == grpc.StatusCode.UNAVAILABLE else err.code().name
            if not states or states[-1] != state:
                states.append(state)
            if state == "SERVING":
                break
            time.sleep(0.01)
    finally:
        channel.close()
    return process, address, states, log


def _check_launched(process: subprocess.Popen[str], states: list[str], stderr: IO[str], timeout_s: float) -> None:
    """CheckFailed when the launched server is not SERVING: it exited, or it did not get there in time."""
    if states and states[-1] == "SERVING":
        return
    seen = f" (health states seen: {', '.join(states)})" if states else ""
    if process.poll() is not None:
        stderr.seek(0)
        said = stderr.read().strip().splitlines()
        raise CheckFailed(
            f"the launched server exited with code {process.returncode} before serving{seen}"
            + (f": {said[-1]}" if said else "")
        )
    raise CheckFailed(
        f"the launched server did not report SERVING within {timeout_s:g}s{seen}; a slow start (a loaded "
        "machine, a large env) needs a longer --launch-timeout"
    )


def _prepare(target: Target) -> tuple[pb.EnvSpec, pb.ServerInfo]:
    """Reach the server and describe the env; CheckFailed names what stops the suite from starting."""
    try:
        info = target.call("GetServerInfo", pb.GetServerInfoRequest(), timeout=min(target.timeout, 10.0))
    except grpc.RpcError as err:
        raise CheckFailed(f"cannot use {target.address}: {err.code().name}: {err.details()}") from err
    describe = pb.DescribeEnvRequest(env_id=target.env_id)
    describe.config.update(target.config)
    try:
        spec = target.call("DescribeEnv", describe)
    except grpc.RpcError as err:
        raise CheckFailed(
            f"env {target.env_id!r} with config {target.config}: {err.code().name}: {err.details()} "
            f"(served: {', '.join(info.env_ids)})"
        ) from err
    return spec, info


def run_conformance(
    address: str | None,
    env_id: str,
    *,
    config: dict[str, Any] | None = None,
    second: str | None = None,
    token: str | None = None,
    crash_action: str | None = None,
    garbage: str | None = None,
    launch: str | None = None,
    only: list[str] | None = None,
    report: Callable[[str], None] = print,
    launch_timeout_s: float = 60.0,
) -> dict[str, CheckResult]:
    """Run the checks (all, or ``only`` these names, in suite order); returns check name -> outcome."""
    from env_servers.conformance import CHECKS

    process, states, stderr = None, [], None
    if launch:
        process, address, states, stderr = _launch(launch, timeout=launch_timeout_s)
    if address is None:
        raise ValueError("give the server's address, or --launch a command that starts it")
    target = Target(address, env_id, dict(config or {}), token)
    other = Target(second, env_id, dict(config or {}), token) if second else None
    results: dict[str, CheckResult] = {}
    try:
        try:
            if process is not None and stderr is not None:
                _check_launched(process, states, stderr, launch_timeout_s)
            spec, info = _prepare(target)
        except CheckFailed as err:
            results["connect"] = CheckResult("FAIL", str(err))
            report(f"FAIL  connect  {err}  (no check could run)")
            return results
        suite = Suite(target, spec, info, other, launched=process, loading_states=states)
        if garbage is not None:
            suite.garbage = garbage
        suite.crash_action = crash_action
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            results[name] = _run(check, suite)
            target.close_opened()
            outcome = results[name]
            report(f"{outcome.status}  {name}{'  ' + outcome.detail if outcome.detail else ''}")
    finally:
        target.close()
        if other is not None:
            other.close()
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if stderr is not None:
            stderr.close()
    return results


def _run(check: Callable[[Suite], None], suite: Suite) -> CheckResult:
    try:
        check(suite)
    except Skipped as why:
        return CheckResult("SKIP", str(why))
    except CheckFailed as err:
        return CheckResult("FAIL", str(err) or type(err).__name__)
    except grpc.RpcError as err:
        return CheckResult("FAIL", f"{err.code().name}: {err.details()}")
    except Exception as err:
        return CheckResult("FAIL", f"{type(err).__name__}: {err}")
    return CheckResult("PASS")
