"""The conformance suite run from a test: every check runs, none fails, and its report is the failure message."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from env_servers.conformance import CHECKS, CheckResult, run_conformance


def conforms(address: str | None, env_id: str, *, passed: Iterable[str] = (), **kwargs: Any) -> dict[str, CheckResult]:
    """The suite's results for ``env_id`` at ``address`` (``kwargs``: `run_conformance`'s), asserting that every
    check ran, none failed, and those in ``passed`` passed rather than skipped."""
    lines: list[str] = []
    results = run_conformance(address, env_id, report=lines.append, **kwargs)
    report = f"{env_id}\n" + "\n".join(lines)
    assert set(results) == set(CHECKS), report
    assert not [name for name, outcome in results.items() if outcome.failed], report
    for name in passed:
        assert results[name].status == "PASS", f"{name} did not pass: {report}"
    return results
