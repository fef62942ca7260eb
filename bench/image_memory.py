"""Does an env server's memory stay bounded when every observation carries an image? (issue 31)

    python bench/image_memory.py [--episodes 10000] [--sessions 32] [--size 64] [--every 1000]

Starts one `python -m env_servers serve pictures` process (tests/support/image_envs.py: a PNG of ``size`` x
``size`` random pixels with the reset and with every step, 3 steps per episode), plays ``--episodes`` episodes
through `EnvPool` (batch transport, ``--sessions`` sessions at once) and prints the server's resident memory
(VmRSS) every ``--every`` episodes, with the image bytes it has sent so far. Bounded means: after warm-up the RSS
stays flat while the bytes sent grow (the replay caches keep only each session's latest Reset and Step).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.support.results import Run  # noqa: E402
from roll_lightning.env_client import EnvPool  # noqa: E402
from roll_lightning.env_client.local import launch_local_server  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def run(args: argparse.Namespace, bench_run: Run) -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), str(REPO), os.environ.get("PYTHONPATH", "")])
    server = launch_local_server(["pictures"], extra_args=["--import", "support.image_envs"])
    pid = server.process.pid
    config = {"size": args.size, "max_steps": 3}
    done, sent, next_report = 0, 0, 0
    rows: list[dict[str, float]] = []
    start = time.perf_counter()

    def report() -> None:
        row = {"episodes": done, "image_mib_sent": sent / 2**20, "server_rss_mib": rss_mib(pid)}
        row["seconds"] = time.perf_counter() - start
        rows.append(row)
        print(f"{done:>9} {row['image_mib_sent']:>15.1f} {row['server_rss_mib']:>15.1f} {row['seconds']:>8.1f}")

    print(f"server pid {pid}, load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    print(f"{'episodes':>9} {'image MiB sent':>15} {'server RSS MiB':>15} {'seconds':>8}")
    try:
        async with EnvPool([server.address], transport="batch") as pool:
            sessions = [await pool.open("pictures", config) for _ in range(args.sessions)]
            counter = iter(range(args.episodes))

            async def player(session) -> None:  # noqa: ANN001
                nonlocal done, sent, next_report
                for seed in counter:
                    first = await session.reset(seed=seed)
                    sent += sum(len(image.data) for image in first.images)
                    while True:
                        out = await session.step("go")
                        sent += sum(len(image.data) for image in out.images)
                        if out.done:
                            break
                    done += 1
                    if done >= next_report:
                        report()
                        next_report += args.every

            await asyncio.gather(*(player(session) for session in sessions))
            report()
    finally:
        server.stop()
    path = bench_run.write({"config": vars(args), "rows": rows})
    print(bench_run.footer())
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--size", type=int, default=64, help="picture side in pixels (random pixels: ~3 B/pixel)")
    parser.add_argument("--every", type=int, default=1000, help="print a line every this many episodes")
    asyncio.run(run(parser.parse_args(), Run("image_memory")))


if __name__ == "__main__":
    main()
