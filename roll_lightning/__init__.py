"""roll_lightning: a PyTorch-Lightning trainer for multi-turn LLM agents with RL.

Importing this package is cheap on purpose: env hosts import the protocol stubs (`roll_lightning.protocol.v1`)
without torch installed.
"""

__version__ = "0.1.0"
