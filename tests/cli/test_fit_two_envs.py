"""Several envs in one ``fit`` (``data.rollout.envs``), as users run it: FrozenLake on the trainer's own local server,
Sokoban on a separate server started with ``python -m env_servers serve`` (a "remote" host on 127.0.0.1), held-out
evaluation on a size training never plays; per-tag metrics in CSV and TensorBoard, per-tag progress; a config
that cannot work is one line naming the key, before a model loads. The SIGKILL resume with two tags is in
test_resume.py.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import TINY, run_cli

from roll_lightning.env_client.local import LocalServer, launch_local_server

SOKOBAN = {"tag": "sokoban", "env_id": "sokoban", "env_config": {"dim_room": [6, 6]}, "episode": {"max_turns": 2}}
FROZENLAKE = {"tag": "frozenlake", "env_id": "frozenlake", "env_config": {"size": 4}}


def two_envs(path: Path, remote: str, **changes: Any) -> str:
    """A config file on top of tiny.yaml: FrozenLake (local) and Sokoban (at ``remote``), one group each."""
    rollout = {
        "env_id": None,
        "envs": [{**FROZENLAKE, "groups": 1}, {**SOKOBAN, "groups": 1, "endpoints": [remote]}],
        **changes.pop("rollout", {}),
    }
    path.write_text(yaml.safe_dump({"data": {"rollout": rollout, **changes}}))
    return str(path)


@pytest.fixture(scope="module")
def remote_sokoban() -> Iterator[LocalServer]:
    """``python -m env_servers serve sokoban --port 0``: a server the trainer did not start and does not stop."""
    server = launch_local_server(["sokoban"])
    yield server
    server.stop()


def csv_rows(root: Path) -> list[dict[str, str]]:
    (path,) = root.glob("lightning_logs/version_0/metrics.csv")
    with path.open() as f:
        return list(csv.DictReader(f))


def test_two_envs_on_two_servers_train_and_evaluate_per_tag(remote_sokoban: LocalServer, tmp_path: Path) -> None:
    held_out = [FROZENLAKE, {**SOKOBAN, "tag": "sokoban7x7", "env_config": {"dim_room": [7, 7]}, "episodes": 3}]
    evaluation = {"episodes": 2, "during_fit": True, "at_fit_start": True, "envs": held_out}
    extra = two_envs(tmp_path / "two.yaml", remote_sokoban.address, evaluation=evaluation)
    root = tmp_path / "run"
    done = run_cli(
        "fit", "--config", TINY, "--config", extra, "--trainer.default_root_dir", str(root),
        "--trainer.val_check_interval", "2", "--trainer.logger", json.dumps([
            {"class_path": "CSVLogger", "init_args": {"save_dir": str(root)}},
            {"class_path": "TensorBoardLogger", "init_args": {"save_dir": str(root), "name": "tensorboard"}},
        ]), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout + done.stderr
    assert "on frozenlake (1 groups) + sokoban (1 groups), 8 episodes per rollout step" in out
    assert re.search(r"success [\d.]+ return [-\d.]+ \(frozenlake [\d.]+ sokoban [\d.]+\)", out), out[-2000:]
    assert re.search(r"held-out success [\d.]+% \(frozenlake [\d.]+%, sokoban7x7 [\d.]+%\) after 0 rollout", out)

    rows = csv_rows(root)
    train = [r for r in rows if r.get("rollout/episodes")]
    assert len(train) == 3
    for row in train:  # exactly one group of 4 of each env per step, and each tag's metrics beside the aggregate
        assert float(row["rollout/frozenlake/episodes"]) == float(row["rollout/sokoban/episodes"]) == 4
        for key in ("rollout/sokoban/success_rate", "rollout/frozenlake/return_mean", "env/sokoban/step_latency_s"):
            assert row[key] != "", key
    evals = [r for r in rows if r.get("eval/success_rate")]
    assert len(evals) >= 2  # before the first update, and after step 2
    for row in evals:
        assert row["eval/frozenlake/success_rate"] != "" and row["eval/sokoban7x7/success_rate"] != ""
        assert "eval/sokoban/success_rate" not in row or row["eval/sokoban/success_rate"] == ""  # not evaluated

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = root.glob("tensorboard/version_0/events.out.tfevents.*")
    accumulator = EventAccumulator(str(events)).Reload()
    scalars = set(accumulator.Tags()["scalars"])
    assert {
        "rollout/sokoban/success_rate",
        "rollout/frozenlake/success_rate",
        "eval/sokoban7x7/success_rate",
    } <= scalars

    from tensorboard.plugins.custom_scalar import layout_pb2

    layout = layout_pb2.Layout.FromString(accumulator.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    assert [c.title for c in layout.category][-1] == "per env"  # each env's success, training and held-out

    dumps = sorted(root.rglob("trajectories/step_*.jsonl"))
    assert dumps
    for path in dumps:
        episodes = [json.loads(line) for line in path.read_text().splitlines()]
        assert {e["tag"] for e in episodes} == {"frozenlake", "sokoban"}  # a sample of the 8
        assert all(e["group"].startswith(e["tag"] + "/") for e in episodes)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("partition", r"data\.rollout\.envs: the groups per batch \(1 \+ 2 = 3\) must sum to .* = 2$"),
        ("not-served", r"data\.rollout\.envs\[0\]\.env_id='frozenlake': no endpoint of data\.envs\.endpoints=\['127"),
        ("budget", r"data\.rollout\.envs\[1\]\.episode\.max_context_tokens: max_context_tokens=20 is smaller than"),
        ("eval-tags", r"data\.evaluation\.envs\[1\]\.tag='sokoban' is also data\.evaluation\.envs\[0\]'s"),
    ],
)
def test_a_multi_env_config_that_cannot_work_is_one_line_naming_the_key(
    case: str, message: str, remote_sokoban: LocalServer, tmp_path: Path
) -> None:
    path, remote = tmp_path / "bad.yaml", remote_sokoban.address
    if case == "partition":
        extra = two_envs(path, remote, rollout={"envs": [{**FROZENLAKE, "groups": 1}, {**SOKOBAN, "groups": 2}]})
    elif case == "not-served":  # every env goes to the Sokoban-only server
        extra = two_envs(path, remote, envs={"endpoints": [remote]})
    elif case == "budget":  # more room than the 16-token reply, less than any Sokoban board
        tight = {**SOKOBAN, "groups": 1, "endpoints": [remote], "episode": {"max_context_tokens": 20}}
        extra = two_envs(path, remote, rollout={"envs": [{**FROZENLAKE, "groups": 1}, tight]})
    else:
        extra = two_envs(path, remote, evaluation={"envs": [SOKOBAN, SOKOBAN]})
    done = run_cli("fit", "--config", TINY, "--config", extra, "--trainer.default_root_dir", "run", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("roll_lightning: error:")]
    assert re.search(message, line), line
    assert "Traceback" not in done.stderr and "Loading weights" not in done.stderr  # no model was loaded
    assert not list(tmp_path.rglob("*.ckpt"))
