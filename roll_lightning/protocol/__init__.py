"""The env protocol. `roll_lightning.protocol.v1` holds the stubs generated from
protos/roll_lightning/protocol/v1/env.proto (regenerate with `python protos/generate.py`); the trainer-side client
lives in `roll_lightning.env_client`. The proto package, and so every name on the wire, stays `roll_lightning.env.v1`
(`/roll_lightning.env.v1.EnvService/Step`): only the Python package is called `protocol`."""
