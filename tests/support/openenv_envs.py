"""OpenEnv environments written for the tests with `openenv-core`'s own types, and a way to serve one as OpenEnv
serves envs (its `create_app` under uvicorn), in a subprocess that prints its URL:

    python -m support.openenv_envs guess                      # {"url": "http://127.0.0.1:PORT"}
    python -m support.openenv_envs med_safety_gym.app:app     # an env package's own app

- `GuessEnv`: guess a number from 1 to 9 (``guess`` string action; seeded; ``higher``/``lower`` hints; a guess
  that is not a number is ``action_valid`` false; the distance to the number in metadata).
- `MovesEnv`: one session at a time (as OpenEnv's chess app): a board and its legal moves as a list field, an
  ``Optional[str]`` action field.
- `NotesEnv`: an MCP env (FastMCP tools ``read(box)`` and ``answer(code)``); the code of box ``b`` is ``11*b``
  and the task is box 3.
- `RaisingEnv`, `SlowEnv`, `MalformedEnv`: envs that fail as foreign envs do (an exception, a step that takes
  ``SLOW_S``, an observation whose reward is not a number).
- `dipg_dataset`: a dataset file for the published `openenv-dipg-safety` package, and the variables naming it.
- `running`: a command that prints ``{"url": ...}`` first (this module, ``python -m env_servers openenv``, an
  env package's server), started for as long as the block runs; yields its URL (and process) once ``/health``
  answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastmcp import FastMCP
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State

SLOW_S = 30.0
DIPG_ROW = {  # one question in the format of the openenv-dipg-safety package's dataset
    "messages": [
        {"role": "user", "content": "<context>Drug X was tested in 10 patients. Median survival was 12 months."
         "</context>\n<question>What was the median survival with drug X?</question>\nPROOF:\nMedian survival was "
         "12 months."},
        {"role": "assistant", "content": "12 months"},
    ]
}  # fmt: skip


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    feedback: str
    action_valid: bool = True  # a field, not metadata: OpenEnv's wire does not carry metadata


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, 9)
        self._state = State(episode_id=episode_id or "episode", step_count=0)
        return GuessObservation(feedback="Guess my number from 1 to 9.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        self._state.step_count += 1
        try:
            guess = int(action.guess.strip())
        except ValueError:
            return GuessObservation(feedback="Not a number.", reward=0.0, action_valid=False)
        if guess == self.target:
            return GuessObservation(feedback="Correct!", reward=1.0, done=True, metadata={"distance": 0})
        hint = "higher" if guess < self.target else "lower"
        return GuessObservation(feedback=hint, reward=0.0, metadata={"distance": abs(guess - self.target)})

    @property
    def state(self) -> State:
        return self._state


class MoveAction(Action):
    move: str | None = None  # Optional[str]: JSON schema anyOf string/null, as many OpenEnv envs declare text


class BoardObservation(Observation):
    board: str
    legal_moves: list[str]


class MovesEnv(Environment[MoveAction, BoardObservation, State]):
    """One session at a time, as OpenEnv's chess app: a board and its legal moves (a list field beside the one
    string field); a legal move scores 1, and every reply 0.01 a character (a random policy's replies differ, so
    GRPO groups carry a signal); two moves end it."""

    SUPPORTS_CONCURRENT_SESSIONS = False

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.moves: list[str] = []

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> BoardObservation:
        rng = random.Random(seed)
        self.moves = rng.sample(["a1", "b2", "c3", "d4", "e5", "f6"], 3)
        self._state = State(episode_id=episode_id or "episode", step_count=0)
        return BoardObservation(board=f"board {rng.randrange(100)}", legal_moves=self.moves)

    def step(self, action: MoveAction, timeout_s: float | None = None, **_: Any) -> BoardObservation:
        self._state.step_count += 1
        move = (action.move or "").strip()
        reward = float(move in self.moves) + 0.01 * len(move)
        done = self._state.step_count >= 2
        return BoardObservation(board="board", legal_moves=self.moves, reward=reward, done=done)

    @property
    def state(self) -> State:
        return self._state


class NotesEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("notes")
        self.answered: str | None = None

        @mcp.tool()
        def read(box: int) -> str:
            """Read the code in a box (1-9)."""
            return f"code {box * 11}"

        @mcp.tool()
        def answer(code: str) -> str:
            """Answer with the code of box 3."""
            self.answered = code
            return "answered"

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> Observation:
        self.answered = None
        return Observation(metadata={"task": "answer with the code in box 3"})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **_: Any) -> Observation:
        return Observation(reward=0.0)

    def _ended(self, obs: Observation) -> Observation:
        if self.answered is not None:
            obs.done, obs.reward = True, 1.0 if self.answered == "33" else 0.0
        return obs

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._ended(super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """OpenEnv's server calls this one (over ``/ws``), not `step`."""
        return self._ended(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state


class RaisingEnv(GuessEnv):
    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        raise RuntimeError("the foreign env broke")


class SlowEnv(GuessEnv):
    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        time.sleep(SLOW_S)
        return super().step(action)


class MalformedEnv(GuessEnv):
    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        obs = super().step(action)
        object.__setattr__(obs, "reward", "lots")  # past pydantic's checks, as a buggy env's serializer might
        return obs


ENVS = {
    "guess": (GuessEnv, GuessAction, GuessObservation),
    "slow": (SlowEnv, GuessAction, GuessObservation),
    "moves": (MovesEnv, MoveAction, BoardObservation),  # one session at a time
}


def serve(name: str) -> None:
    """Serve ``ENVS[name]`` with OpenEnv's `create_app`, or the ASGI app ``name`` names (``module:app``), on a free
    loopback port; print the URL first. ``notes@production``: `NotesEnv` in OpenEnv's production mode (no
    ``/reset``, ``/step`` or ``/state``: agents reach it over ``/ws`` and ``/mcp``)."""
    import importlib

    import uvicorn
    from openenv.core.env_server.http_server import create_app

    if name == "notes@production":
        from fastapi import FastAPI
        from openenv.core.env_server.http_server import HTTPEnvServer
        from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

        app = FastAPI()
        HTTPEnvServer(NotesEnv, CallToolAction, CallToolObservation, max_concurrent_envs=64).register_routes(
            app, mode="production"
        )
    elif ":" in name:
        module, _, attribute = name.partition(":")
        app = getattr(importlib.import_module(module), attribute)
    else:
        env_cls, action_cls, observation_cls = ENVS[name]
        sessions = 64 if env_cls.SUPPORTS_CONCURRENT_SESSIONS else 1
        app = create_app(env_cls, action_cls, observation_cls, env_name=name, max_concurrent_envs=sessions)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(json.dumps({"url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def dipg_dataset(folder: Path) -> dict[str, str]:
    """A one-question dataset for the DIPG env (its default is a Hugging Face dataset, unreachable here), as the
    environment variables that point the package at it."""
    path = folder / "dipg.jsonl"
    path.write_text(json.dumps(DIPG_ROW) + "\n")
    return {"DIPG_DATASET_PATH": str(path), "HF_HUB_OFFLINE": "1"}


@dataclass
class Served:
    url: str
    process: subprocess.Popen

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@contextlib.contextmanager
def running(*command: str, **env: str) -> Iterator[Served]:
    """Run ``python <command>`` (``tests/`` importable) until the block ends; yield its URL and process."""
    tests = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    log = tempfile.TemporaryFile(mode="w+")  # not a pipe: a server that logs much would block on a full one
    proc = subprocess.Popen(
        [sys.executable, *command], stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "PYTHONPATH": path, **env},
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            proc.wait()
            log.seek(0)
            raise RuntimeError(f"{' '.join(command)} exited before serving: {log.read()[-2000:]}")
        url = json.loads(line)["url"]
        for _ in range(600):  # a hang guard (60 s), not a timing
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield Served(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    serve(sys.argv[1])
