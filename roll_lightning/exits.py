"""How ``python -m roll_lightning`` ends when a run does not finish (docs/reliability.md, docs/training.md).

Exit statuses: 2 bad input (one line ``roll_lightning: error: ...``; ``ROLL_DEBUG=1`` shows the traceback),
143 SIGTERM, 130 SIGINT (stopped the same way as SIGTERM), 1 the envs failed for good or a peer rank failed,
3 ``validate --certificate``: the replay differs from the run certificate. Any other exception is a bug and keeps
its traceback.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib.util
import os
import signal
import sys
import threading
import time
from argparse import ArgumentError
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, TracebackType
from typing import NoReturn

from roll_lightning.env_client.errors import EnvOutage, EpisodeFailed, EpisodesKeepFailing  # grpc only: no torch

DEBUG_ENV = "ROLL_DEBUG"
_PROJECT_PACKAGES = ("roll_lightning", "env_servers")
_RESUME_HINT = "resume with --ckpt_path last"
EXIT_GRACE_S = 60.0  # see `exit_within`
CERTIFICATE_DIFFERS = 3  # `validate --certificate`: something differs (docs/reliability.md, "Run certificate")


def run_cli(run: Callable[[list[str] | None], None], args: list[str] | None = None) -> None:
    """Run the CLI, turning an early stop into one line and an exit status.

    ``args=None`` rewrites ``sys.argv`` in place (LightningCLI warns when given both)."""
    argv = join_negative_values(sys.argv[1:] if args is None else list(args))
    if args is None:
        sys.argv[1:] = argv
    with sigint_as_sigterm() as received:
        try:
            run(None if args is None else argv)
        except (KeyboardInterrupt, SystemExit) as stop:
            exit_stopped(stop, received)
        except Exception as err:
            if debugging():
                raise
            if is_peer_failure(err):
                fail(f"{err}; every step all ranks completed is checkpointed: {_RESUME_HINT}", 1)
            if is_peer_gone(err):
                fail(
                    "another rank's process ended while this one waited for it in a collective (its log says why); "
                    f"this rank stops with it; every step all ranks completed is checkpointed: {_RESUME_HINT}", 1
                )  # fmt: skip
            if is_agent_failure(err):
                fail(f"{err}; fix the agent (run its command by hand to see why), then {_RESUME_HINT}", 1)
            if is_env_failure(err):
                what = err.detail if isinstance(err, EpisodeFailed) else str(err)  # without the status code's name
                fail(f"{what}; every completed step is checkpointed: {_RESUME_HINT} once the envs are back", 1)
            if not is_input_error(err):
                raise
            fail(describe_input_error(err, argv))


def debugging() -> bool:
    """``ROLL_DEBUG`` set (not empty or 0): input errors keep their traceback."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fail(message: str, status: int = 2) -> NoReturn:
    print(f"roll_lightning: error: {message}", file=sys.stderr)
    exit_within(status)
    sys.exit(status)


def is_env_failure(err: BaseException) -> bool:
    return isinstance(err, (EnvOutage, EpisodesKeepFailing))


def is_agent_failure(err: BaseException) -> bool:
    """The run stopped because the agent program kept failing (lazy lookup: no torch import)."""
    module = sys.modules.get("roll_lightning.rollout.agents.runner")
    return module is not None and isinstance(err, module.AgentsKeepFailing)


def is_peer_failure(err: BaseException) -> bool:
    """Another rank failed and this one stopped with it (lazy lookup: no torch import)."""
    module = sys.modules.get("roll_lightning.rollout.runtime.world_stop")
    return module is not None and isinstance(err, module.PeerRankFailed)


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer")  # gloo, when the other end's process ended


def is_peer_gone(err: BaseException) -> bool:
    """A gloo collective failed because another rank's process ended (e.g. its set-up failed before the world
    stop could tell this rank)."""
    text = str(err)
    return isinstance(err, RuntimeError) and "gloo" in text and any(sign in text for sign in _PEER_GONE)


# -- bad input -------------------------------------------------------------------------------------------


def is_input_error(err: BaseException) -> bool:
    """Whether ``err`` reports bad input (one line) rather than a bug (a traceback).

    A `ValueError` raised inside torch or transformers is a bug; one raised by the project's own code is not.
    """
    if isinstance(err, ArgumentError) or _is_lightning_misconfiguration(err):
        return True
    if isinstance(err, (ValueError, ImportError)) and type(err).__module__.split(".")[0] in _PROJECT_PACKAGES:
        return True
    return isinstance(err, (ValueError, FileNotFoundError)) and _raised_by_project(err.__traceback__)


def _is_lightning_misconfiguration(err: BaseException) -> bool:
    """A Trainer setting Lightning refuses (lazy lookup: no Lightning import)."""
    module = sys.modules.get("lightning.fabric.utilities.exceptions")
    return module is not None and isinstance(err, module.MisconfigurationException)


def _raised_by_project(tb: TracebackType | None) -> bool:
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_project_dirs())


@functools.cache
def _project_dirs() -> tuple[str, ...]:
    """The project's package folders, found without importing them."""
    dirs = []
    for name in _PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(str(Path(location).resolve()) + os.sep)
    return tuple(dirs)


def describe_input_error(err: BaseException, argv: list[str]) -> str:
    """The message, naming the YAML problem when the parser only says "Problems parsing config"."""
    message = str(err)
    if isinstance(err, ArgumentError) and "Problems parsing config" in message:
        for path in config_files(argv):
            problem = yaml_problem(path)
            if problem:
                return problem
    return message


def config_files(argv: list[str]) -> list[Path]:
    out: list[Path] = []
    for i, token in enumerate(argv):
        if token in ("--config", "-c") and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith("--config="):
            value = token.split("=", 1)[1]
        else:
            continue
        if Path(value).is_file():
            out.append(Path(value))
    return out


def yaml_problem(path: Path) -> str | None:
    """``path, line L, column C: <problem>`` for invalid YAML, else None."""
    import yaml

    try:
        with path.open(encoding="utf-8") as f:
            yaml.safe_load(f)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = "; ".join(str(part) for part in (err.problem, err.context) if part)
        return f"{path}{where}: {what or 'not valid YAML'}"
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        return f"{path}: not valid YAML: {err}"
    return None


def join_negative_values(argv: list[str]) -> list[str]:
    """``--key -1e-4`` → ``--key=-1e-4``: argparse takes ``-1e-4`` or ``-inf`` for an option."""
    out: list[str] = []
    for token in argv:
        previous = out[-1] if out else ""
        if _is_negative_number(token) and previous.startswith("--") and previous != "--" and "=" not in previous:
            out[-1] = f"{previous}={token}"
        else:
            out.append(token)
    return out


def _is_negative_number(token: str) -> bool:
    if not token.startswith("-"):
        return False
    try:
        float(token)
    except ValueError:
        return False
    return True


# -- signals ---------------------------------------------------------------------------------------------


@contextmanager
def sigint_as_sigterm() -> Iterator[list[int]]:
    """Route SIGINT to the current SIGTERM handler, so Ctrl-C stops a run the same way; yields the SIGINTs
    received. Without a SIGTERM handler SIGINT is a `KeyboardInterrupt`; an ignored one stays ignored."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        None,
    ):
        yield received
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        handler = signal.getsignal(signal.SIGTERM)
        if not callable(handler):
            raise KeyboardInterrupt
        handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)


def exit_stopped(stop: KeyboardInterrupt | SystemExit, sigints: list[int]) -> NoReturn:
    """Exit 130 after SIGINT and 143 after SIGTERM, with a resume hint; other exits pass through."""
    if sigints or isinstance(stop, KeyboardInterrupt):
        # Lightning would exit 1 for KeyboardInterrupt and 0 for SIGTERM
        print(f"roll_lightning: stopped by SIGINT; {_RESUME_HINT}", file=sys.stderr)
        exit_within(128 + signal.SIGINT)
        sys.exit(128 + signal.SIGINT)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    # SystemExit(143): the rollout's SIGTERM handler with no rollout in flight
    if isinstance(stop, SIGTERMException) or (isinstance(stop, SystemExit) and stop.code == 128 + signal.SIGTERM):
        print(f"roll_lightning: stopped by SIGTERM; {_RESUME_HINT}", file=sys.stderr)
        exit_within(128 + signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)
    raise stop


def exit_within(status: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Force exit with ``status`` if interpreter exit takes over ``grace_s``, dumping every thread's stack: a
    stuck non-daemon thread would otherwise hold a preempted job and its GPUs forever."""
    exiting = threading.Event()

    def watchdog() -> None:
        exiting.wait()
        time.sleep(grace_s)
        holding = [t.name for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()]
        print(
            f"roll_lightning: still exiting {grace_s:g}s after the run stopped, held by threads {holding}; "
            f"ending with status {status} (every thread's stack follows)",
            file=sys.stderr,
            flush=True,
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(status)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()
    # runs before interpreter exit joins threads (the hook concurrent.futures uses)
    threading._register_atexit(exiting.set)  # type: ignore[attr-defined]


def close_process_group() -> None:
    """Destroy the process group after a run that ended well: left to interpreter exit, Gloo's threads can
    SIGABRT (pytorch #190489). Not after a failure: a peer still in a collective would hang it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank closes while another still reads the last collective
        dist.destroy_process_group()
