"""A chaos run anyone can point at their setup: N env servers and a `fit`, faults on a schedule, and a verdict
from the run's own records.

Faults, in turn, one every ``--fault-every`` seconds:
- ``kill-server``: SIGKILL one server, restart it on its port 3 s later;
- ``stop-server``: SIGSTOP one server for 10 s, then SIGCONT;
- ``stop-all``: SIGSTOP every server for 5 s;
- ``term-trainer``: SIGTERM the trainer, wait for it to exit, resume it with ``--ckpt_path last``;
- ``kill-trainer`` (with ``--kill-trainer``): SIGKILL the trainer, resume it the same way.

The verdict, from the trajectory dumps (every episode of every step) and each trainer process's metrics:
- steps: rollout steps trained (the last checkpoint's count);
- lost: groups never trained that no ``*_dropped_*`` counter accounts for: a gap in a lane's group numbers
  (``<tag>/g<n>/s<seed>``) below its highest, minus the groups the run says it dropped;
- doubled: groups trained in two steps;
- longest gap: the most seconds between two trained steps (a hang shows here; a trainer restart counts too);
- faults seen: for each server fault, whether an env/ fault counter (ejections, retries, outage waits, failed or
  retried calls) grew between the last step before it and the first step after it;
- held exits and exit hangs: trainers whose exit after SIGTERM a stuck thread held until their own watchdog ended
  it (the log names the thread), and trainers still there ``EXIT_WAIT_S`` after the signal (then killed).

Run:  .venv/bin/python bench/chaos.py --minutes 60 --servers 3 --fault-every 90
      .venv/bin/python bench/chaos.py --quick           (each fault once, 20 s apart, about 2 minutes: what CI runs)
Prints the verdict and writes bench/results/chaos-<utc time>.json; exits 1 when a group is lost or doubled,
no step came for ``--hang-s`` seconds, or a trainer's exit was held or hung.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402
from env_servers.ports import free_port  # noqa: E402
from roll_lightning.env_client.local import LocalServer, launch_local_server  # noqa: E402

SERVER_FAULTS = ("kill-server", "stop-server", "stop-all")
FAULT_COUNTERS = ("env/ejections_total", "env/episode_retries_total", "env/outage_waits_total")
EVIDENCE = ("env/failed_calls_total", "env/retried_calls_total")  # further signs that a call met the fault
EXIT_WAIT_S = 180.0  # a trainer not gone this long after SIGTERM is hung (its own exit watchdog fires at 60 s)
HELD_EXIT = "roll_lightning: still exiting"  # what the trainer's exit watchdog prints (roll_lightning.exits)


@dataclass
class Chaos:
    root: Path
    ports: list[int]
    servers: list[LocalServer] = field(default_factory=list)
    trainer: subprocess.Popen[str] | None = None
    starts: int = 0
    log: list[dict] = field(default_factory=list)

    def start_servers(self) -> None:
        self.servers = [launch_local_server(["frozenlake"], port=port) for port in self.ports]

    def restart_server(self, k: int) -> None:
        self.servers[k] = launch_local_server(["frozenlake"], port=self.ports[k])

    def start_trainer(self, steps: int) -> None:
        endpoints = json.dumps([f"127.0.0.1:{port}" for port in self.ports])
        args = [
            sys.executable, "-m", "roll_lightning", "fit", "--config", str(REPO / "configs" / "tiny.yaml"),
            "--data.envs.endpoints", endpoints, "--model.rollout_steps", str(steps),
            "--data.envs.outage_timeout_s", "600", "--trainer.default_root_dir", str(self.root),
            "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(self.root),
            "--trainer.callbacks+=roll_lightning.callbacks.TrajectoryDump", "--trainer.callbacks.every_n_steps", "1",
            "--trainer.callbacks.max_episodes", "0",
        ]  # fmt: skip
        if self.starts:
            args += ["--ckpt_path", "last"]
        self.starts += 1
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.trainer = subprocess.Popen(
            args,
            cwd=self.root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.root / f"trainer{self.starts}.log").open("w"),
            text=True,
        )

    def fault(self, kind: str, rng: random.Random, steps: int) -> None:
        at = time.time()
        if kind == "kill-server":
            k = rng.randrange(len(self.servers))
            self.servers[k].process.kill()
            self.servers[k].process.wait()
            time.sleep(3)
            self.restart_server(k)
        elif kind == "stop-server":
            k = rng.randrange(len(self.servers))
            os.kill(self.servers[k].process.pid, signal.SIGSTOP)
            time.sleep(10)
            os.kill(self.servers[k].process.pid, signal.SIGCONT)
        elif kind == "stop-all":
            for server in self.servers:
                os.kill(server.process.pid, signal.SIGSTOP)
            time.sleep(5)
            for server in self.servers:
                os.kill(server.process.pid, signal.SIGCONT)
        else:  # term-trainer, kill-trainer
            self.stop_trainer(signal.SIGTERM if kind == "term-trainer" else signal.SIGKILL)
            self.start_trainer(steps)
        self.log.append({"fault": kind, "at": at, "took_s": round(time.time() - at, 1)})

    def stop_trainer(self, sig: int) -> None:
        """Send ``sig`` and wait for the exit; one that does not come within `EXIT_WAIT_S` is logged as a hang
        (the verdict fails it) and the trainer is killed, so the run goes on."""
        assert self.trainer is not None
        self.trainer.send_signal(sig)
        try:
            self.trainer.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.log.append({"fault": "exit-hang", "at": time.time(), "took_s": EXIT_WAIT_S, "trainer": self.starts})
            self.trainer.kill()
            self.trainer.wait()

    def stop(self) -> None:
        if self.trainer is not None and self.trainer.poll() is None:
            self.stop_trainer(signal.SIGTERM)
        for server in self.servers:
            os.kill(server.process.pid, signal.SIGCONT)
            server.stop()


def verdict(root: Path, faults: list[dict]) -> dict:
    """What the run's own records say (see the module docstring)."""
    steps: dict[int, list[str]] = {}
    for path in root.rglob("trajectories/step_*.jsonl"):
        steps[int(path.stem.split("_")[1])] = sorted({json.loads(line)["group"] for line in path.open()})
    trained = [g for step in sorted(steps) for g in steps[step]]
    numbers: dict[str, set[int]] = defaultdict(set)
    for group in set(trained):
        lane, number, _ = group.split("/")
        numbers[lane].add(int(number[1:]))
    gaps = sum(max(ns) + 1 - len(ns) for ns in numbers.values())
    processes = _processes(root)
    dropped = sum(
        rows[-1][1].get("env/dropped_groups_failed_total", 0) + rows[-1][1].get("rollout/dropped_groups_stale_total", 0)
        for rows in processes
        if rows
    )
    times = sorted(t for rows in processes for t, _ in rows)
    seen = [_seen(fault, processes) for fault in faults if fault["fault"] in SERVER_FAULTS]
    logs = [log.read_text() for log in sorted(root.glob("trainer*.log"))]
    held = [text[text.index(HELD_EXIT) :] for text in logs if HELD_EXIT in text]
    return {
        "steps": max(steps, default=0),
        "groups_trained": len(set(trained)),
        "lost": max(0, int(gaps - dropped)),
        "number_gaps": gaps,
        "dropped_by_the_run": dropped,
        "doubled": len(trained) - len(set(trained)),
        "longest_gap_s": round(max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0), 1),
        "faults": {
            kind: sum(f["fault"] == kind for f in faults)
            for kind in sorted({f["fault"] for f in faults} - {"exit-hang"})
        },
        "fault_counters": {
            name: sum(rows[-1][1].get(name, 0.0) for rows in processes if rows) for name in FAULT_COUNTERS
        },
        "server_faults_seen": f"{sum(seen)}/{len(seen)}",
        "every_server_fault_seen": all(seen),
        "trainer_processes": len(processes),
        # exits a stuck thread held until the trainer's watchdog ended them, and exits that never came
        "held_exits": len(held),
        "held_exit_report": held[0][:4000] if held else "",  # which thread held the exit, and every stack
        "exit_hangs": sum(f["fault"] == "exit-hang" for f in faults),
    }


def _processes(root: Path) -> list[list[tuple[float, dict[str, float]]]]:
    """Per trainer process (one CSV version folder each): its metric rows, each with the time its step was
    trained (the mtime of that step's trajectory dump)."""
    out = []
    for path in sorted(root.rglob("metrics.csv"), key=lambda p: int(p.parent.name.split("_")[-1])):
        rows = []
        for row in csv.DictReader(path.open()):
            values = {k: float(v) for k, v in row.items() if v}
            dump = path.parent / "trajectories" / f"step_{int(values['step']):06d}.jsonl"
            if dump.exists():
                rows.append((dump.stat().st_mtime, values))
        out.append(sorted(rows, key=lambda r: r[0]))
    return out


def _seen(fault: dict, processes: list[list[tuple[float, dict[str, float]]]]) -> bool:
    """Whether a server fault shows in the env/ counters: one of them grew between the last step before it and
    the first step well after it (within one trainer process); a fault no process straddles counts as seen."""
    start, end = fault["at"], fault["at"] + fault["took_s"] + 15
    for rows in processes:
        before = [v for t, v in rows if t <= start]
        after = [v for t, v in rows if t >= end]
        if before and after:
            return any(after[0].get(n, 0) > before[-1].get(n, 0) for n in (*FAULT_COUNTERS, *EVIDENCE))
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--fault-every", type=float, default=90.0)
    parser.add_argument("--kill-trainer", action="store_true", help="SIGKILL the trainer too (then resume it)")
    parser.add_argument("--hang-s", type=float, default=120.0, help="a longer gap between steps fails the run")
    parser.add_argument("--root", type=Path, default=None, help="the run's folder (default: a new one in /tmp)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=None, help="end after this many rounds of the faults")
    parser.add_argument("--quick", action="store_true", help="each fault once, 20 s apart (about 2 minutes)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.fault_every = 1, 20.0
    run = Run("chaos", quick=args.quick)
    root = args.root or Path(f"/tmp/roll_chaos_{int(time.time())}")
    root.mkdir(parents=True, exist_ok=True)
    kinds = [*SERVER_FAULTS, "term-trainer", *(["kill-trainer"] if args.kill_trainer else [])]
    if args.rounds is not None:  # the trainer stops first, so the resumed trainer meets every server fault
        kinds = [kind for kind in kinds if kind.endswith("trainer")] + [*SERVER_FAULTS]
    faults = None if args.rounds is None else args.rounds * len(kinds)
    chaos, rng = Chaos(root, [free_port() for _ in range(args.servers)]), random.Random(args.seed)
    chaos.start_servers()
    chaos.start_trainer(steps=1_000_000)
    end, k = time.time() + 60 * args.minutes, 0
    try:
        while time.time() < end and k != faults:
            time.sleep(min(args.fault_every, max(0.0, end - time.time())))
            if time.time() >= end:
                break
            if chaos.trainer is not None and chaos.trainer.poll() is not None:
                raise SystemExit(f"the trainer exited by itself ({chaos.trainer.returncode}); see {root}/trainer*.log")
            chaos.fault(kinds[k % len(kinds)], rng, steps=1_000_000)
            k += 1
        if k == faults:  # steps well after the last fault, so it is seen in the counters
            time.sleep(args.fault_every + 10)
    finally:
        chaos.stop()
    result = verdict(root, chaos.log)
    ok = result["lost"] == 0 and result["doubled"] == 0 and result["longest_gap_s"] < args.hang_s
    ok = ok and result["held_exits"] == 0 and result["exit_hangs"] == 0
    result["ok"] = ok
    print(json.dumps(result, indent=2))
    run.write(
        {"verdict": result, "faults": chaos.log, "root": str(root), "args": {k: str(v) for k, v in vars(args).items()}}
    )
    print(run.footer())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
