"""The rollout's process glue: its asyncio loop thread and signals (`loop.py`), a stop agreed by every rank
(`world_stop.py`), the env servers of a run (`servers.py`)."""
