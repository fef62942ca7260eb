"""``fit`` on environments nobody here wrote, in one run as a user would mix them: an OpenEnv env written with
`openenv-core` (run in the env server's process), the same env behind its own OpenEnv server (a URL), the
published `openenv-dipg-safety` package, an OpenEnv MCP env's tools, and a TextArena game; every lane plays,
the model updates, and the run resumes from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import yaml
from support.cli import fit_tiny, logged_metrics
from support.openenv_envs import dipg_dataset, running

# PPO with a critic: its advantages move even when every reply of a group earns the same (a random model's
# replies to these envs mostly do), so each step really updates the policy.
PPO = ["--model.algorithm.estimator", "ppo-gae"]
CALL = '<tool_call>\n{"name": "read", "arguments": {"box": 3}}\n</tool_call>'


def _config(path: Path, url: str) -> str:
    episode = {"layout": "step", "max_turns": 2, "max_context_tokens": 1024, "sampling": {"max_new_tokens": 6}}
    tools = {**episode, "prompt": {"reply_prefix": CALL, "history_turns": 2, "tool_parser": "hermes"}}
    dipg = {"reward_min": -50.0, "reward_max": 50.0, "deterministic": False}
    envs = [
        {"tag": "guess", "env_id": "openenv:support.openenv_envs:GuessEnv", "env_config": {"max_steps": 2}},
        {"tag": "guess_url", "env_id": f"openenv:{url}", "env_config": {"max_steps": 2}},
        {"tag": "dipg", "env_id": "openenv:med_safety_gym.app:get_environment", "env_config": dipg},
        {"tag": "notes", "env_id": "openenv:support.openenv_envs:NotesEnv", "env_config": {"max_steps": 2},
         "episode": tools},
        {"tag": "arena", "env_id": "textarena:GuessTheNumber-v0", "env_config": {"max_steps": 2}},
    ]  # fmt: skip
    rollout = {"env_id": None, "batch_size": 20, "envs": [{**e, "groups": 1} for e in envs], "episode": episode}
    path.write_text(yaml.safe_dump({"data": {"rollout": rollout}}))
    return str(path)


def test_openenv_and_textarena_envs_train_in_one_run_and_resume(tmp_path: Path) -> None:
    data = dipg_dataset(tmp_path)  # read by the package in the env server
    with running("-m", "support.openenv_envs", "guess") as served:
        extra = _config(tmp_path / "foreign.yaml", served.url)
        done = fit_tiny(tmp_path, extra, 2, *PPO, **data)
        assert done.returncode == 0, done.stderr[-4000:]
        logged = logged_metrics(tmp_path / "run")
        for tag in ("guess", "guess_url", "dipg", "notes", "arena"):
            assert logged[f"rollout/{tag}/episodes"] > 0, tag
        assert logged["train/update_skipped"] == 0.0 and logged["rollout/tool_calls/read"] >= 1
        assert -50 <= logged["rollout/dipg/return_mean"] <= 50 and logged["rollout/dipg/episodes"] == 4
        done = fit_tiny(tmp_path, extra, 3, *PPO, "--ckpt_path", "last", **data)  # one more step from the checkpoint
        assert done.returncode == 0, done.stderr[-4000:]


def test_a_foreign_env_that_always_fails_stops_the_run_in_one_line(tmp_path: Path) -> None:
    rollout = {"env_id": "openenv:support.openenv_envs:RaisingEnv", "env_config": {"max_steps": 2}}
    extra = tmp_path / "raising.yaml"
    extra.write_text(yaml.safe_dump({"data": {"rollout": rollout}}))
    done = fit_tiny(tmp_path, str(extra), 2)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "the foreign env broke" in last, last


def test_grpo_groups_train_on_a_one_session_openenv_server(tmp_path: Path) -> None:
    """`MovesEnv` behind OpenEnv's server with ``max_concurrent_envs`` 1 (as OpenEnv's chess app): the adapter
    learns the limit at describe (a second session is refused, naming it), the spec carries ``max_sessions`` 1,
    and the trainer plays a group of 4 member after member. Without the limit the server refuses every member
    after the first ("Server at capacity: 1/1 sessions active") and no group completes."""
    with running("-m", "support.openenv_envs", "moves") as served:
        rollout = {
            "env_id": f"openenv:{served.url}",
            "env_config": {"max_steps": 2, "observation_template": "{board}\nLegal moves: {legal_moves}"},
            "group_size": 4,
            "batch_size": 8,
        }
        extra = tmp_path / "one_session.yaml"
        extra.write_text(yaml.safe_dump({"data": {"rollout": rollout}}))
        done = fit_tiny(tmp_path, str(extra), 2)
        assert done.returncode == 0, done.stderr[-4000:]
        logged = logged_metrics(tmp_path / "run")
        assert logged["rollout/episodes"] == 8 and logged["train/update_skipped"] == 0.0, logged
        # lock-step plays a batch's 8 episodes at once: refused in one line, not left waiting for a slot
        (tmp_path / "lockstep").mkdir()
        done = fit_tiny(tmp_path / "lockstep", str(extra), 1, "--data.rollout.mode", "lockstep")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert (
            done.stderr.strip()
            .splitlines()[-1]
            .endswith(
                "takes 1 episode(s) at once (its spec's max_sessions) and lock-step plays 8 at once: set "
                "data.rollout.mode async"
            )
        ), done.stderr[-2000:]
