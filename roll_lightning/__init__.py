"""roll_lightning: a PyTorch-Lightning trainer for multi-turn LLM agents with RL.

Cheap to import: env hosts import the protocol stubs without torch installed.
"""

__version__ = "0.1.0"
