"""One episode played turn by turn (`episode.py`), its rows for training (`layout.py`: one per turn or one per
trajectory), and a batch of them (`batch.py`)."""
