"""Bench-only helpers: `results` (what every benchmark records about its run: command, commit, machine, load, wall
time), `engines` (a `SimulatedEngine` with a latency drawn per reply), `latency_env` (an env served with
``python -m env_servers serve ... --import bench.support.latency_env``) and `train_worker` (train_throughput's
worker process)."""
