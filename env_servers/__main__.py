"""`python -m env_servers serve sokoban frozenlake --port 50051` | `python -m env_servers describe sokoban` |
`python -m env_servers openenv frozenlake --port 8000` (one env as an OpenEnv server).

`serve` prints one JSON line when ready (``{"event": "serving", "address": ..., ...}``; launchers read the port
chosen by ``--port 0`` from it), then serves until SIGTERM/SIGINT and drains.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
import sys
from pathlib import Path

from env_servers.api import EnvUnavailable
from env_servers.ports import check_bindable
from env_servers.registry import get_env, known_env_ids

_PR_SET_PDEATHSIG = 1


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token, --token-file or ROLL_ENV_TOKEN (None: no authentication).

    A given source without a usable token is an error, never a quiet fallback to serving without one."""
    from env_servers.server.guards import token_problem

    if args.token is not None and args.token_file is not None:
        raise ValueError("give --token or --token-file, not both")
    if args.token_file is not None:
        try:
            token, source = Path(args.token_file).read_text().strip(), f"--token-file {args.token_file}"
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--token-file {args.token_file}: cannot read the token ({exc})") from exc
    elif args.token is not None:
        token, source = args.token.strip(), "--token"
    elif "ROLL_ENV_TOKEN" in os.environ:
        token, source = os.environ["ROLL_ENV_TOKEN"].strip(), "ROLL_ENV_TOKEN"
    else:
        return None
    problem = token_problem(token)
    if problem:
        raise ValueError(f"{source}: the token {problem}; refusing to serve without authentication by accident")
    return token


def _die_with_parent(parent_pid: int | None) -> None:
    """Arm Linux's parent-death signal (SIGTERM) for ``--parent-pid``. Here, not in the launcher's
    ``preexec_fn``: that can crash (SIGSEGV, seen in CI) in a launcher with threads, as Python's docs warn."""
    if parent_pid is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the launcher stops us itself
        return
    if os.getppid() != parent_pid:  # it died before we armed the signal
        os.kill(os.getpid(), signal.SIGTERM)


def _serve(args: argparse.Namespace) -> int:
    from env_servers.server import ServerConfig, serve_forever

    _die_with_parent(args.parent_pid)
    token = _token(args)
    _import_plugins(args.imports)
    for env_id in args.envs:
        get_env(env_id)  # unknown ids fail here, naming the known ones
    if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("env_servers").warning(
            "serving on %s without a bearer token: anyone who can reach the port can use it", args.host
        )
    config = ServerConfig(
        env_ids=tuple(args.envs),
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        session_ttl_s=args.session_ttl,
        max_action_bytes=args.max_action_bytes,
        max_message_bytes=args.max_message_bytes,
        workers=args.workers,
        drain_seconds=args.drain_seconds,
        token=token,
        tls_cert=_read(args.tls_cert),
        tls_key=_read(args.tls_key),
        seed=args.seed,
        env_configs=_env_configs(args.env_configs),
    )

    def announce(server: object) -> None:
        line = {
            "event": "serving",
            "address": server.address,  # type: ignore[attr-defined]
            "envs": list(config.env_ids),
            "server_id": server.table.server_id,  # type: ignore[attr-defined]
            "pid": os.getpid(),
            "tls": config.tls_cert is not None,
            "token": config.token is not None,
        }
        print(json.dumps(line), flush=True)

    asyncio.run(serve_forever(config, announce=announce))
    # Drained: a normal exit would join worker threads, and could hang on a stuck env.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(0)


def _openenv(args: argparse.Namespace) -> int:
    import socket

    import uvicorn

    _die_with_parent(args.parent_pid)
    _import_plugins(args.imports)
    try:
        from env_servers.envs.openenv.serve import make_app
    except ImportError as exc:
        raise ImportError(
            f"serving as OpenEnv needs openenv-core: pip install 'roll_lightning[openenv]' ({exc})"
        ) from exc
    config = _env_configs([f"{args.env}={args.config}"])[args.env] if args.config else {}
    app = make_app(args.env, config, max_sessions=args.max_sessions)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        logging.getLogger("env_servers").warning(
            "OpenEnv has no authentication: anyone who can reach %s can use it", args.host
        )
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    check_bindable(args.host, args.port)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    print(
        json.dumps({"event": "serving", "url": f"http://{host}:{port}", "env": args.env, "pid": os.getpid()}),
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level.lower()))
    server.run(sockets=[sock])
    return 0


def _env_configs(items: list[str]) -> dict[str, dict]:
    configs: dict[str, dict] = {}
    for item in items:
        env_id, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f'--env-config {item!r}: expected ENV_ID=JSON, e.g. webshop=\'{{"data_dir": "/d"}}\'')
        try:
            values = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--env-config {env_id}: not JSON ({exc})") from exc
        if not isinstance(values, dict):
            raise ValueError(f"--env-config {env_id}: expected a JSON object")
        configs.setdefault(env_id, {}).update(values)
    return configs


def _import_plugins(modules: list[str]) -> None:
    import importlib

    for name in modules:
        importlib.import_module(name)  # registers its envs with @env_servers.register


def _describe(args: argparse.Namespace) -> int:
    import dataclasses

    _import_plugins(args.imports)
    entry = get_env(args.env)
    config = entry.make_config(json.loads(args.config) if args.config else {})
    spec = dataclasses.asdict(entry.describe(config))
    print(json.dumps(spec, indent=2, default=list))
    return 0


def _conformance(args: argparse.Namespace) -> int:
    from env_servers.conformance import CHECKS, run_conformance

    if args.address is None and args.launch is None:
        print("conformance: give the server's HOST:PORT, or --launch a command that starts it", file=sys.stderr)
        return 2
    try:
        config = json.loads(args.config) if args.config else None
    except json.JSONDecodeError as err:
        print(f"conformance: --config is not JSON ({err}): {args.config!r}", file=sys.stderr)
        return 2
    if config is not None and not isinstance(config, dict):
        print(f"conformance: --config must be a JSON object, got {args.config!r}", file=sys.stderr)
        return 2
    unknown = [name for name in args.only or [] if name not in CHECKS]
    if unknown:
        print(f"conformance: --only {', '.join(unknown)}: no such check (checks: {', '.join(CHECKS)})", file=sys.stderr)
        return 2
    results = run_conformance(
        args.address,
        args.env,
        config=config,
        second=args.second,
        token=args.token or os.environ.get("ROLL_ENV_TOKEN"),
        crash_action=args.crash_action,
        garbage=args.garbage,
        launch=args.launch,
        only=args.only,
        launch_timeout_s=args.launch_timeout,
    )
    failed = [name for name, outcome in results.items() if outcome.failed]
    skipped = [name for name, outcome in results.items() if outcome.status == "SKIP"]
    ran = len(results) - len(skipped)
    print(
        f"{ran - len(failed)}/{ran} checks passed"
        + (f", {len(skipped)} skipped ({', '.join(skipped)})" if skipped else "")
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_servers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve one or more envs over gRPC")
    serve.add_argument("envs", nargs="+", help=f"env ids to serve (built in: {', '.join(known_env_ids())})")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 for other hosts")
    serve.add_argument("--port", type=int, default=50051, help="0 picks a free port (printed on the ready line)")
    serve.add_argument("--max-sessions", type=int, default=4096, help="capacity; more gives RESOURCE_EXHAUSTED")
    serve.add_argument("--session-ttl", type=float, default=600.0, help="seconds before an idle session is closed")
    serve.add_argument("--max-action-bytes", type=int, default=65536, help="larger action texts are refused")
    serve.add_argument(
        "--max-message-bytes",
        type=int,
        help="largest request gRPC reads (larger: RESOURCE_EXHAUSTED, unread); "
        "default 256 * (max-action-bytes + 1024) + 1 MiB, room for a full BatchStep",
    )
    serve.add_argument("--workers", type=int, default=4, help="threads running env code")
    serve.add_argument("--drain-seconds", type=float, default=10.0, help="grace period on SIGTERM")
    serve.add_argument("--token", help="require 'authorization: Bearer TOKEN' (or set ROLL_ENV_TOKEN)")
    serve.add_argument("--token-file", help="read the bearer token from a file (empty or unreadable: an error)")
    serve.add_argument("--tls-cert", help="PEM certificate chain (enables TLS, with --tls-key)")
    serve.add_argument("--tls-key", help="PEM private key")
    serve.add_argument("--seed", type=int, help="seed for server-drawn episode seeds (unseeded Resets)")
    serve.add_argument(
        "--env-config",
        dest="env_configs",
        action="append",
        default=[],
        metavar="ENV=JSON",
        help="operator config for one env (repeatable): defaults for every session, and the only way to set "
        'server-only fields, e.g. webshop=\'{"data_dir": "/data/webshop"}\'',
    )
    serve.add_argument("--log-level", default="INFO")
    serve.add_argument(
        "--parent-pid",
        type=int,
        help="stop (SIGTERM: a graceful drain) when the process with this pid, our parent, exits, even by a crash "
        "(Linux); launchers such as the trainer's local servers pass their own pid",
    )
    serve.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers more envs (repeatable), e.g. --import my_pkg.envs",
    )
    serve.set_defaults(func=_serve)

    describe = sub.add_parser("describe", help="print an env's spec as JSON")
    describe.add_argument("env")
    describe.add_argument("--config", help="env config as JSON, e.g. '{\"dim_room\": [8, 8]}'")
    describe.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE")
    describe.set_defaults(func=_describe)

    openenv = sub.add_parser("openenv", help="serve one env as an OpenEnv server (HTTP and WebSocket)")
    openenv.add_argument("env", help="the env id to serve")
    openenv.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 for other hosts")
    openenv.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on the ready line)")
    openenv.add_argument("--config", help="env config as JSON, e.g. '{\"size\": 4}'")
    openenv.add_argument("--max-sessions", type=int, default=64, help="concurrent WebSocket sessions")
    openenv.add_argument("--log-level", default="WARNING")
    openenv.add_argument("--parent-pid", type=int, help="stop when the process with this pid exits (Linux)")
    openenv.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE")
    openenv.set_defaults(func=_openenv)

    conformance = sub.add_parser("conformance", help="check that a running server (any language) follows the protocol")
    conformance.add_argument("address", nargs="?", help="host:port of the server under test (or --launch)")
    conformance.add_argument("--env", required=True, help="env id to test on that server")
    conformance.add_argument("--config", help="env config as JSON")
    conformance.add_argument("--second", help="host:port of a second process of the same server (determinism check)")
    conformance.add_argument("--token", help="bearer token, if the server requires one (checks UNAUTHENTICATED)")
    conformance.add_argument("--crash-action", help="an action that makes the env raise (checks INTERNAL)")
    conformance.add_argument(
        "--garbage", help="a reply the env must refuse with action_valid=false (default: a snowman text; '' skips)"
    )
    conformance.add_argument(
        "--launch", help="start the server with this command ({port} = a free port): checks loading and drain"
    )
    conformance.add_argument(
        "--launch-timeout", type=float, default=60.0, help="seconds the --launch server has to report SERVING"
    )
    conformance.add_argument("--only", nargs="+", metavar="CHECK", help="run only these checks")
    conformance.set_defaults(func=_conformance)

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "INFO"), stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request to a foreign env otherwise
    try:
        return args.func(args)
    except (KeyError, ValueError, OSError, ImportError, EnvUnavailable) as exc:
        print(f"error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
