"""docs/agents.md runs as written (issue 47): each of its code snippets is a file of the repository, its install
line names extras that install `openai`, and its `fit` command, run as written from the repository's root, trains
the docs' agent beside FrozenLake on the tiny model without a failed call (the agent asks `max_tokens=512` of a
made-up model, and its command's `python` is the trainer's interpreter even when PATH has no such `python`)."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from support.cli import ROOT, cli_env, dumped_episodes, logged_metrics

from env_servers.ports import free_port

DOC = ROOT / "docs" / "agents.md"


def _snippets() -> list[tuple[str, str]]:
    """The doc's fenced code blocks: (language, text)."""
    return re.findall(r"^```(\w+)\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)


def _commands(prefix: str) -> list[str]:
    return [
        line for lang, text in _snippets() if lang == "bash" for line in text.splitlines() if line.startswith(prefix)
    ]


def test_every_code_snippet_is_a_file_and_the_install_names_the_agent_extra() -> None:
    files = {path.read_text(encoding="utf-8") for path in [*ROOT.glob("examples/**/*"), *ROOT.glob("configs/*")]
             if path.is_file()}  # fmt: skip
    code = [(lang, text) for lang, text in _snippets() if lang != "bash"]
    assert [lang for lang, _ in code] == ["python", "yaml"] * 3
    for lang, text in code:
        assert text in files, f"this {lang} snippet of docs/agents.md is no file under examples/ or configs/"
    (install,) = _commands("pip install")
    extras = re.search(r"\.\[([\w,]+)\]", install)
    assert extras is not None, install
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras[1].split(",")) == {"train", "agent"} <= set(optional)
    assert any(need.startswith("openai") for need in optional["agent"])


def test_the_docs_fit_command_runs_as_written(tmp_path: Path) -> None:
    (command,) = [c for c in _commands("python -m roll_lightning fit") if "my_run.yaml" in c]
    root = tmp_path / "run"
    here = Path(sys.executable).parent.absolute()  # not on PATH: `python` must still be this interpreter
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p).absolute() != here)
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:], "--trainer.default_root_dir", str(root),
         "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root)],
        cwd=ROOT, env=cli_env(tmp_path, PATH=path), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    logged = logged_metrics(root)
    assert logged["rollout/mine/episodes"] == logged["rollout/lake/episodes"] == 4  # a group of each per step
    assert logged["env/episode_retries_total"] == 0  # not one failed episode: every agent call was answered
    assert logged["rollout/agent_max_tokens_clamped_total"] >= 3 * 4  # every trained agent call asked for 512
    assert logged["rollout/agent_starts_total"] >= 3 * 4  # a program per episode
    mine = [ep for ep in dumped_episodes(root) if ep["tag"] == "mine"]
    assert mine and all(len(ep["turns"]) == 1 for ep in mine)  # its one call, one row


def test_the_docs_long_running_agent_plays_every_episode_from_one_process(tmp_path: Path) -> None:
    """The same agent with ``lifetime: run``, as written: one start for the run, every call answered, its episodes
    trained beside FrozenLake's."""
    (command,) = [c for c in _commands("python -m roll_lightning fit") if "my_service_run.yaml" in c]
    root = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:], "--trainer.default_root_dir", str(root),
         "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root)],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    logged = logged_metrics(root)
    assert logged["rollout/mine/episodes"] == logged["rollout/lake/episodes"] == 4
    assert logged["rollout/agent_starts_total"] == 1  # one program played every episode of the run
    assert logged["env/episode_retries_total"] == 0 and logged["rollout/agent_max_tokens_clamped_total"] >= 3 * 4
    mine = [ep for ep in dumped_episodes(root) if ep["tag"] == "mine"]
    assert mine and all(len(ep["turns"]) == 1 and ep["turns"][0]["observation"].startswith("[user] Puzzle ")
                        for ep in mine)  # fmt: skip


def test_the_built_in_env_agent_plays_frozenlake_through_the_env_client(tmp_path: Path) -> None:
    """The docs' two commands as written, but for the server's port: a free one, given to the agent as
    ROLL_ENV_ADDRESS. Every member plays its map move by move, one call (one row) per move."""
    (serve,) = _commands("python -m env_servers serve frozenlake")
    (command,) = [c for c in _commands("python -m roll_lightning fit") if "lake_run.yaml" in c]
    port = free_port()
    argv = [sys.executable, *shlex.split(serve.rstrip(" &").replace("50051", str(port)))[1:]]
    server = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().startswith("{"), "the server did not start"
        root = tmp_path / "run"
        done = subprocess.run(
            [sys.executable, *shlex.split(command)[1:], "--trainer.default_root_dir", str(root),
             "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root)],
            cwd=ROOT, env=cli_env(tmp_path, ROLL_ENV_ADDRESS=f"127.0.0.1:{port}"), capture_output=True, text=True,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
    assert done.returncode == 0, done.stderr[-4000:]
    logged = logged_metrics(root)
    assert logged["rollout/lake_agent/episodes"] == 8 and logged["env/episode_retries_total"] == 0
    played = [ep for ep in dumped_episodes(root) if ep["tag"] == "lake_agent"]
    assert played and all(1 <= len(ep["turns"]) <= 4 for ep in played)
    assert any(len(ep["turns"]) > 1 for ep in played), "some map took more than one move"
    first = played[0]["turns"][0]["observation"]
    assert first.startswith("[system] You are playing FrozenLake.") and "[user] " in first  # the board, as text


def test_the_docs_try_command_plays_and_shows_episodes_without_training(tmp_path: Path) -> None:
    """`validate` with ``show_episodes``, as written: each episode as training would record it, no update (no
    checkpoint written), and an agent's refused call counted (an agent whose first call asks for two choices)."""
    (command,) = _commands("python -m roll_lightning validate")
    root = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:], "--trainer.default_root_dir", str(root)],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    said = done.stdout + done.stderr
    assert "validate: held-out success" in said and "over 4 episodes" in said, said[-3000:]
    mine = re.findall(r"episode mine seed \d+ member 0: 1 turn\(s\) in 1 row\(s\), return [+-][\d.]+, terminated", said)
    lake = re.findall(r"episode lake seed \d+ member 0: \d turn\(s\) in \d row\(s\)", said)
    assert len(mine) == len(lake) == 2, said[-3000:]
    assert re.search(r"  1\. saw '\[user\] Puzzle \d+ \(easy\): what comes next\?' -> replied ", said), said[-3000:]
    assert not list(root.rglob("*.ckpt")), "validate trains nothing and saves nothing"
    agent = tmp_path / "refused_once.py"
    agent.write_text(REFUSED_ONCE)
    entry = {"tag": "mine", "env_id": "my-agent", "agent": {"command": [sys.executable, str(agent)]}}
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:], "--trainer.default_root_dir", str(root),
         "--data.rollout.envs", json.dumps([entry]), "--data.evaluation.episodes", "1"],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert "1 turn(s) in 1 row(s), return +1.00, terminated, 1 call(s) refused" in done.stdout + done.stderr


REFUSED_ONCE = """import json, os, urllib.error, urllib.request
def post(url, body):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request))
messages = [{"role": "user", "content": "Hello."}]
try:
    post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", {"model": "m", "messages": messages, "n": 2})
except urllib.error.HTTPError as refused:
    assert refused.code == 400
post(os.environ["OPENAI_BASE_URL"] + "/chat/completions", {"model": "m", "messages": messages})
post(os.environ["ROLL_REWARD_URL"], {"reward": 1.0})
"""


def test_an_openai_agents_sdk_agent_trains_as_written(tmp_path: Path) -> None:
    """`examples/agents/sdk_agent.py` (the OpenAI Agents SDK, unmodified but for the endpoint the trainer gives it)
    trains: every call answered, every update with a signal, the engine's log-probs the trainer's."""
    (command,) = [c for c in _commands("python -m roll_lightning fit") if "sdk_run.yaml" in c]
    root = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, *shlex.split(command)[1:], "--model.rollout_steps", "2", "--trainer.default_root_dir",
         str(root), "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(root)],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [r for r in csv.DictReader(next(root.rglob("metrics.csv")).open()) if r.get("train/update_skipped")]
    assert len(rows) == 2 and all(float(r["rollout/walker/episodes"]) == 8 for r in rows)
    assert all(float(r["train/update_skipped"]) == 0.0 and float(r["train/zero_advantage_share"]) < 1 for r in rows)
    assert all(float(r["train/logprob_gap"]) < 1e-4 for r in rows), [r["train/logprob_gap"] for r in rows]
    assert float(rows[-1]["env/episode_retries_total"]) == 0  # not one failed call
