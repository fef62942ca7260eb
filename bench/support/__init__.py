"""Bench-only helpers (envs served with ``python -m env_servers serve ... --import bench.support.<module>``)."""
