"""The env protocol. `roll_lightning.env.v1` holds the stubs generated from protos/roll_lightning/env/v1/env.proto
(regenerate with `python protos/generate.py`); the trainer-side client lives in `roll_lightning.env_client`."""
