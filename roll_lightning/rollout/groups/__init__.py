"""A group of episodes on one start and the queue of finished groups (`queue.py`: staleness), and the filters that
choose which groups train (`filters.py`)."""
