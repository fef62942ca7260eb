"""``fit`` with the user's own agent program beside an env, as users run it (issue 33): an agent written with the
official `openai` client plays one env's episodes through the policy's chat endpoint, FrozenLake plays the
other's, both train in one run and it resumes; an agent that keeps crashing stops the run with one line that
blames it."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from support.cli import TESTS, dumped_episodes, dumped_groups, fit_tiny, logged_metrics

AGENT = str(TESTS / "support" / "agents" / "openai_agent.py")


def _config(path: Path, command: list[str], lake: bool = True) -> str:
    envs = [
        {"tag": "agent", "env_id": "agent", "agent": {"command": command, "deadline_s": 120}, "groups": 1},
        {"tag": "lake", "env_id": "frozenlake", "env_config": {"size": 4}, "groups": 1},
    ]
    if not lake:  # the agent's groups alone
        envs = [{**envs[0], "groups": 2}]
    episode = {"layout": "step", "max_turns": 2, "sampling": {"max_new_tokens": 6}}
    path.write_text(yaml.safe_dump({"data": {"rollout": {"env_id": None, "envs": envs, "episode": episode}}}))
    return str(path)


def test_an_openai_client_agent_and_an_env_train_together_and_resume(tmp_path: Path) -> None:
    extra = _config(tmp_path / "agents.yaml", [sys.executable, AGENT])
    # groups may start a version ahead, as env groups do; GiGPO's step groups: calls with the same prompt
    ahead = ("--data.rollout.max_staleness", "1", "--model.algorithm.estimator", "gigpo")
    done = fit_tiny(tmp_path, extra, 2, *ahead)
    assert done.returncode == 0, done.stderr[-4000:]
    root = tmp_path / "run"
    logged = logged_metrics(root)
    assert logged["rollout/agent/episodes"] > 0 and logged["rollout/lake/episodes"] > 0
    assert logged["rollout/agent/success_rate"] == 1.0  # what the agent reported
    dumped = dumped_episodes(root)
    agent_turns = [len(ep["turns"]) for ep in dumped if ep["tag"] == "agent"]
    assert agent_turns and set(agent_turns) == {2}  # its two calls, one row each

    done = fit_tiny(tmp_path, extra, 3, *ahead, "--ckpt_path", "last")  # one more step from the checkpoint
    assert done.returncode == 0, done.stderr[-4000:]
    groups = dumped_groups(root)  # the agent's groups and the env's: each trained once, none skipped
    assert sorted(groups) == [1, 2, 3] and all(len(g) == 2 for g in groups.values())
    trained = [group for step in groups.values() for group in step]
    assert len(trained) == len(set(trained))


def test_an_agent_that_keeps_crashing_stops_the_run_in_one_line(tmp_path: Path) -> None:
    """The line blames the agent, not the envs (issue 47), and ends with its stderr's last lines: here a failed
    import's traceback."""
    crash = ["python", "-c", "import sys; print('no model for me', file=sys.stderr); import no_such_agent_library"]
    more = ("--data.rollout.episode_retries", "0", "--data.rollout.max_failed_groups_in_a_row", "1")
    done = fit_tiny(tmp_path, _config(tmp_path / "agents.yaml", crash), 1, *more)
    assert done.returncode == 1 and not any(line.startswith("Traceback") for line in done.stderr.splitlines())
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("roll_lightning: error: 1 groups in a row were dropped because the agent program kept")
    assert "the agent crashed" in last and "no model for me | Traceback (most recent call last):" in last, last
    assert "No module named 'no_such_agent_library'; fix the agent" in last and "envs are back" not in last, last


def test_a_group_filter_sorts_agent_groups_as_it_sorts_env_groups(tmp_path: Path) -> None:
    """The agent reports the same reward to every member of a group (its reward depends on the seed alone): the
    zero-variance filter rejects each such group, plays the extra groups it may, then completes the batch."""
    more = ("--data.rollout.group_filter.kind", "zero_variance", "--data.rollout.group_filter.max_extra_groups", "1")
    done = fit_tiny(tmp_path, _config(tmp_path / "agents.yaml", [sys.executable, AGENT], lake=False), 1, *more)
    assert done.returncode == 0, done.stderr[-4000:]
    logged = logged_metrics(tmp_path / "run")
    assert logged["rollout/groups_filtered"] >= 1 and logged["rollout/agent/episodes"] > 0
