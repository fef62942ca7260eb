"""``fit`` on tool envs, as users run it: the tiny model trains on the calculator env and on an MCP server's tools
(`support.mcp_servers`, started by the env server) in one run, the tool results enter its conversation, the
per-tool metrics are logged, and it resumes from its checkpoint; a prompt that would hide the tool results is
refused in one line before any work."""

from __future__ import annotations

from pathlib import Path

import yaml
from support.cli import dumped_episodes, fit_tiny, logged_metrics

# The reply starts with a whole call (the prefix is the product's own prefill), so the random model makes at least
# one well-formed `calculate` call a turn; the MCP env has no such tool and answers it with an error result.
CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
CALCULATOR = {"tag": "calc", "env_id": "calculator", "env_config": {"max_steps": 2}, "groups": 1}
CAPITALS = {"tag": "capitals", "env_id": "mcp:support.mcp_tasks:CapitalTask", "env_config": {"max_steps": 2}}


def _config(path: Path, history_turns: int = 2) -> str:
    episode = {
        "layout": "step", "max_turns": 2, "max_context_tokens": 4096, "sampling": {"max_new_tokens": 4},
        "prompt": {"reply_prefix": CALL, "history_turns": history_turns, "tool_parser": "hermes"},
    }  # fmt: skip
    rollout = {"env_id": None, "envs": [CALCULATOR, {**CAPITALS, "groups": 1}], "episode": episode}
    path.write_text(yaml.safe_dump({"data": {"rollout": rollout}}))
    return str(path)


def test_a_calculator_and_an_mcp_server_train_together_and_resume(tmp_path: Path) -> None:
    extra = _config(tmp_path / "tools.yaml")
    done = fit_tiny(tmp_path, extra, 2)
    assert done.returncode == 0, done.stderr[-4000:]
    root = tmp_path / "run"
    logged = logged_metrics(root)
    assert logged["rollout/tool_calls/calculate"] >= 1 and logged["rollout/tool_calls_per_turn"] >= 1
    assert 0 < logged["rollout/invalid_tool_call_rate"] < 1  # the MCP env has no calculate tool
    assert logged["rollout/calc/episodes"] > 0 and logged["rollout/capitals/episodes"] > 0

    dumped = dumped_episodes(root)
    results = {
        (ep["env_id"], r["content"], r["is_error"]) for ep in dumped for t in ep["turns"] for r in t["tool_results"]
    }
    assert ("calculator", "42", False) in results
    assert any(env.startswith("mcp:") and error and "calculate" in content for env, content, error in results)

    done = fit_tiny(tmp_path, extra, 3, "--ckpt_path", "last")  # one more step from the checkpoint
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_tool_env_with_no_history_is_refused_in_one_line(tmp_path: Path) -> None:
    done = fit_tiny(tmp_path, _config(tmp_path / "tools.yaml", history_turns=0), 1)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "history_turns" in last, last
