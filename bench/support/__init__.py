"""Bench-only helpers: `results` (what every benchmark records about its run: command, commit, machine, load, wall
time), `latency_env` (an env served with ``python -m env_servers serve ... --import bench.support.latency_env``)
and `train_worker` (train_throughput's worker process). A reply time drawn per reply is `SimulatedEngine`'s own
(``latency_s`` may be a callable)."""
