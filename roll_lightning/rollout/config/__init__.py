"""The rollout's settings: `rollout.py` (`RolloutConfig`, `EnvsConfig`, `EvalConfig`) and `envs.py` (each env entry
resolved into a lane)."""
