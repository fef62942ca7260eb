"""`python -m env_servers describe | serve`, run as users run them (subprocesses), and what an env host imports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_describe_and_serve_errors_name_the_problem():
    spec = json.loads(run("-m", "env_servers", "describe", "frozenlake", "--config", '{"size": 5}').stdout)
    assert spec["env_id"] == "frozenlake" and spec["max_steps"] > 0
    bad = run("-m", "env_servers", "serve", "sokobam")
    assert bad.returncode == 2 and "unknown env id 'sokobam'" in bad.stderr and "sokoban" in bad.stderr
    bad = run("-m", "env_servers", "describe", "sokoban", "--config", '{"num_boxes": 99}')
    assert bad.returncode == 2 and "num_boxes" in bad.stderr


def test_env_servers_run_without_torch_transformers_or_vllm():
    # Env hosts are small machines: serving and playing must never import the training stack.
    script = textwrap.dedent(
        """
        import asyncio, sys
        for name in ("torch", "transformers", "vllm", "lightning"):
            sys.modules[name] = None  # any import of these now fails
        from env_servers.server import EnvServer, ServerConfig
        from roll_lightning.env_client import EnvPool

        running = EnvServer.run_in_thread(ServerConfig(env_ids=("sokoban", "frozenlake")))

        async def main():
            async with EnvPool([running.address]) as pool:
                for env_id in ("sokoban", "frozenlake"):
                    session = await pool.open(env_id)
                    await session.reset(seed=0)
                    await session.step("<answer>Up</answer>")

        asyncio.run(main())
        running.stop()
        print("ok")
        """
    )
    done = run("-c", script)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
