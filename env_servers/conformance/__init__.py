"""The conformance suite: what any env server, in any language, must do to be driven by roll_lightning.

    python -m env_servers conformance 127.0.0.1:50051 --env sokoban [--second HOST:PORT] [--config JSON]
        [--token T] [--crash-action TEXT] [--garbage TEXT]
    python -m env_servers conformance --launch "node server.js guess_number --port {port} --max-sessions 8 \\
        --session-ttl 2" --env guess_number

It speaks the raw protocol and checks each rule of env.proto's header (docs/writing-an-env.md lists them with
their check names and the options that unlock some), printing PASS, FAIL or SKIP with the reason per check; it
exits 1 if any failed.
"""

from __future__ import annotations

from env_servers.conformance.forks import (
    check_fork_exact,
    check_fork_independent,
    check_fork_refused,
    check_fork_retry,
    check_fork_sessions,
)
from env_servers.conformance.images import check_images
from env_servers.conformance.optional import (
    check_auth,
    check_batch_mixed,
    check_batches,
    check_capacity,
    check_drain,
    check_env_crash,
    check_idle_reaping,
    check_loading,
    check_stream,
)
from env_servers.conformance.rules import (
    check_action_size_limit,
    check_bad_requests,
    check_deadline,
    check_determinism,
    check_garbage_reply,
    check_health,
    check_reflection,
    check_replay,
    check_replay_scope,
    check_request_id_required,
    check_seeds,
    check_server_info,
    check_spec,
    check_step_after_done,
    check_step_rules,
    check_unknown_session,
)
from env_servers.conformance.runner import CheckResult, run_conformance
from env_servers.conformance.target import CheckFailed, Skipped, Suite
from env_servers.conformance.tools import check_tools

CHECKS = {  # in run order; "drain" stops the server, so it is last
    "health": check_health,
    "reflection": check_reflection,
    "server-info": check_server_info,
    "spec": check_spec,
    "request-id-required": check_request_id_required,
    "bad-requests": check_bad_requests,
    "unknown-session": check_unknown_session,
    "seeds": check_seeds,
    "replay": check_replay,
    "replay-scope": check_replay_scope,
    "determinism": check_determinism,
    "step-rules": check_step_rules,
    "garbage-reply": check_garbage_reply,
    "step-after-done": check_step_after_done,
    "action-size-limit": check_action_size_limit,
    "deadline": check_deadline,
    "batch": check_batches,
    "batch-mixed": check_batch_mixed,
    "stream": check_stream,
    "images": check_images,
    "tools": check_tools,
    "fork-exact": check_fork_exact,
    "fork-independent": check_fork_independent,
    "fork-retry": check_fork_retry,
    "fork-refused": check_fork_refused,
    "fork-sessions": check_fork_sessions,
    "capacity": check_capacity,
    "idle-reaping": check_idle_reaping,
    "env-crash": check_env_crash,
    "auth": check_auth,
    "loading": check_loading,
    "drain": check_drain,
}

__all__ = ["CHECKS", "CheckFailed", "CheckResult", "Skipped", "Suite", "run_conformance"]
