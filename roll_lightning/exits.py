"""How ``python -m roll_lightning`` ends when a run does not finish: bad input, SIGTERM, SIGINT (Ctrl-C).

- **Bad input** (a malformed or missing config file, an unknown or ill-typed option, a value out of range, a
  setting that needs a package that is not installed) prints one line, ``roll_lightning: error: <message>``
  naming the file or the key, and exits with status 2. ``ROLL_DEBUG=1`` shows the traceback instead. Anything
  else is a bug and keeps its traceback. What counts as bad input is decided by `is_input_error`.
- **SIGTERM** abandons the rollout in flight (`roll_lightning.rollout.datamodule`), stops the env servers and
  exits with status 143, like a process the signal killed; **SIGINT** (Ctrl-C) does exactly the same and exits
  with 130. The last checkpoint is the last completed step; ``--ckpt_path last`` carries on from it. A process
  whose exit a stuck thread holds ends itself a minute later with the same status, naming the thread
  (`exit_within`).
- **The envs fail for good** (every env server down for longer than ``data.envs.outage_timeout_s``, or
  episodes failing group after group) prints one line naming the endpoints or the last error, and that the
  checkpoints hold every completed step, and exits with status 1 (`is_env_failure`). With several ranks, the
  others stop at the same step with one line saying so (`is_peer_failure`).
- **Negative numbers** as option values: ``--model.optim.lr -1e-4`` is read as ``--model.optim.lr=-1e-4``
  (argparse alone takes ``-1e-4`` for an option and fails with "expected one argument").
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
EXIT_GRACE_S = 60.0  # how long a stopping process may take to exit once its run has ended (`exit_within`)


def run_cli(run: Callable[[list[str] | None], None], args: list[str] | None = None) -> None:
    """Run ``run(args)`` (the CLI) and turn the ways it can stop early into one line and an exit status.

    ``args=None`` reads ``sys.argv`` (rewritten in place with negative numbers joined, because LightningCLI
    warns when given both), as the CLI itself would.
    """
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
            if is_env_failure(err):
                what = err.detail if isinstance(err, EpisodeFailed) else str(err)  # without the status code's name
                fail(f"{what}; every completed step is checkpointed: {_RESUME_HINT} once the envs are back", 1)
            if not is_input_error(err):
                raise
            fail(describe_input_error(err, argv))


def debugging() -> bool:
    """``ROLL_DEBUG=1`` (any value but empty or 0): input errors keep their traceback."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def fail(message: str, status: int = 2) -> NoReturn:
    print(f"roll_lightning: error: {message}", file=sys.stderr)
    exit_within(status)
    sys.exit(status)


def is_env_failure(err: BaseException) -> bool:
    """The rollout stopped because the env servers failed for good (not bad input, not a bug)."""
    return isinstance(err, (EnvOutage, EpisodesKeepFailing))


def is_peer_failure(err: BaseException) -> bool:
    """Another rank failed and this one stopped with it, at the same step (`roll_lightning.rollout.world_stop`;
    looked up only if it was imported, which keeps this module free of torch)."""
    module = sys.modules.get("roll_lightning.rollout.world_stop")
    return module is not None and isinstance(err, module.PeerRankFailed)


# -- bad input -------------------------------------------------------------------------------------------


def is_input_error(err: BaseException) -> bool:
    """Whether ``err`` reports bad input (one line) rather than a bug (a traceback).

    Bad input is what the parser refuses (`ArgumentError`), what Lightning refuses as misconfigured, the project's
    own named errors for settings that cannot work (classes defined in this project that subclass `ValueError` or
    `ImportError`: `RolloutConfigError`, `TrainingConfigError`, `EngineConfigError`, a damaged checkpoint, ...),
    and a `ValueError` or `FileNotFoundError` raised by the project's own checks (a model name that is no folder,
    ...). A `ValueError` raised deep inside torch or transformers is not: that one keeps its traceback.
    """
    if isinstance(err, ArgumentError) or _is_lightning_misconfiguration(err):
        return True
    if isinstance(err, (ValueError, ImportError)) and type(err).__module__.split(".")[0] in _PROJECT_PACKAGES:
        return True
    return isinstance(err, (ValueError, FileNotFoundError)) and _raised_by_project(err.__traceback__)


def _is_lightning_misconfiguration(err: BaseException) -> bool:
    """Lightning's name for a Trainer setting it refuses (``--trainer.max_time 00:00:1:00``: not DD:HH:MM:SS);
    looked up only if Lightning was imported, which keeps this module free of it."""
    module = sys.modules.get("lightning.fabric.utilities.exceptions")
    return module is not None and isinstance(err, module.MisconfigurationException)


def _raised_by_project(tb: TracebackType | None) -> bool:
    """The innermost frame (where the exception was raised) is in this project's code."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_project_dirs())


@functools.cache
def _project_dirs() -> tuple[str, ...]:
    """Where the project's packages live (found without importing them)."""
    dirs = []
    for name in _PROJECT_PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.append(str(Path(location).resolve()) + os.sep)
    return tuple(dirs)


def describe_input_error(err: BaseException, argv: list[str]) -> str:
    """The error's message, naming the config file when the parser could only say "Problems parsing config"."""
    message = str(err)
    if isinstance(err, ArgumentError) and "Problems parsing config" in message:
        for path in config_files(argv):
            problem = yaml_problem(path)
            if problem:
                return problem
    return message


def config_files(argv: list[str]) -> list[Path]:
    """The existing files given to ``--config`` / ``-c`` (either spelling), in order."""
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
    """``path, line L, column C: <what is wrong>`` when ``path`` is not valid YAML, else None."""
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
    """``--key -1e-4`` → ``--key=-1e-4``.

    argparse reads a token that starts with ``-`` as an option unless it looks like ``-1`` or ``-0.5``, so
    ``-1e-4``, ``-1E3`` or ``-inf`` after an option failed with "expected one argument". A negative number is
    never an option of this CLI, so it is joined to the option before it.
    """
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
    """SIGINT (Ctrl-C) is handled by whatever handles SIGTERM at that moment, so it stops a run the same way.

    During ``fit``/``validate`` that is the rollout data module's handler in front of Lightning's: the rollout
    in flight is abandoned, the loop stops between steps, the env servers are stopped, nothing is half written.
    Before a trainer runs (parsing, model loading) SIGTERM has no handler, so SIGINT is a `KeyboardInterrupt`.
    Yields the list of SIGINTs received (the exit status depends on it). A SIGINT that was ignored when we
    started (``nohup``, a background job) stays ignored.
    """
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
    """Exit 130 after SIGINT and 143 after SIGTERM, with one line saying how to resume; other exits pass."""
    if sigints or isinstance(stop, KeyboardInterrupt):
        # Lightning turns a KeyboardInterrupt into exit status 1 and a SIGTERM into 0; the status says the signal
        print(f"roll_lightning: stopped by SIGINT; {_RESUME_HINT}", file=sys.stderr)
        exit_within(128 + signal.SIGINT)
        sys.exit(128 + signal.SIGINT)
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    # a plain SystemExit(143) comes from the rollout's SIGTERM handler when no rollout was in flight to abandon
    if isinstance(stop, SIGTERMException) or (isinstance(stop, SystemExit) and stop.code == 128 + signal.SIGTERM):
        print(f"roll_lightning: stopped by SIGTERM; {_RESUME_HINT}", file=sys.stderr)
        exit_within(128 + signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)
    raise stop


def exit_within(status: int, grace_s: float = EXIT_GRACE_S) -> None:
    """End the process with ``status`` if its exit has not finished ``grace_s`` after it began, naming the threads
    that held it and printing every thread's stack (so the one that held it can be fixed).

    Called when a run stops early: interpreter exit waits for every non-daemon thread, and one stuck on something
    the stop already closed would keep a preempted job, and its GPUs, forever. The clock starts when the
    interpreter starts its exit, so a caller that catches the ``SystemExit`` and goes on is left alone."""
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
    # called as interpreter exit begins, before it waits for the threads (concurrent.futures uses the same hook)
    threading._register_atexit(exiting.set)  # type: ignore[attr-defined]


def close_process_group() -> None:
    """Destroy torch.distributed's process group after a run that ended well. Left to interpreter exit, Gloo's
    worker threads can abort the process (SIGABRT: "terminate called without an active exception"; pytorch
    #190489); Lightning closes only NCCL's. Not after a failure: a peer still in a collective would hang it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank closes its connections while another still reads the last collective's answer
        dist.destroy_process_group()
