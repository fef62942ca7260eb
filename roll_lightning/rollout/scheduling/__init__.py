"""The producer: `scheduler.py` keeps groups running and collates batches, with its parts: the generation gate
(`gate.py`), seeds and resume (`ledger.py`), per-env lanes (`lanes.py`, `agent_lanes.py`), replays and outages
(`failures.py`), lockstep rounds (`lockstep.py`), metrics (`metrics.py`)."""
