"""Real env servers on 127.0.0.1 (random free ports) for tests, in a thread of the test process.

Lives here rather than in conftest.py: test folders have conftests of their own, and ``from conftest import``
would pick whichever conftest module was imported last.
"""

from __future__ import annotations

import support.plugin_envs  # noqa: F401  (registers crashy/slow/slowload)
from env_servers.server import EnvServer, RunningServer, ServerConfig

ALL_ENVS = ("sokoban", "frozenlake", "crashy", "slow")


def start_server(**overrides: object) -> RunningServer:
    config = ServerConfig(env_ids=overrides.pop("env_ids", ALL_ENVS), port=0, **overrides)  # type: ignore[arg-type]
    return EnvServer.run_in_thread(config)
