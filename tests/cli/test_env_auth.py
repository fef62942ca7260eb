"""`fit` against a token-protected env server with the wrong `--data.envs.token`: one line naming the endpoint.

Before, health checks (open without a token) passed, every GetServerInfo was refused, and the run waited out the
pool's 30 s start timeout to say "no env endpoint is reachable and serving", which named no token at all.
"""

from __future__ import annotations

from pathlib import Path

from support.cli import run_cli

from roll_lightning.env_client.local import launch_local_server

ROOT = Path(__file__).parent.parent.parent


def test_fit_with_a_wrong_token_names_the_endpoint_that_refused_it(tmp_path: Path) -> None:
    server = launch_local_server(["frozenlake"], extra_args=["--token", "s3cret"])
    args = [
        "fit", "--config", str(ROOT / "configs" / "tiny.yaml"), "--data.envs.endpoints", f'["{server.address}"]',
        "--data.envs.token", "wrong", "--trainer.default_root_dir", str(tmp_path / "run"),
    ]  # fmt: skip
    try:
        done = run_cli(*args, cwd=tmp_path)
    finally:
        server.stop()
    assert done.returncode != 0
    named = [line for line in done.stderr.splitlines() if server.address in line and "UNAUTHENTICATED" in line]
    assert named, done.stderr[-3000:]
    assert "data.envs.token" in named[-1] and "bearer token is missing or wrong" in named[-1], named[-1]
    assert "no env endpoint is reachable" not in done.stderr
    assert "Loading weights" not in done.stderr, "it stopped before loading the model"
