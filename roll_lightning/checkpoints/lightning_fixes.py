"""A fix to Lightning's checkpoint loading that an elastic resume needs (applied on import of
`roll_lightning.checkpoints`).

`ModelParallelStrategy` loading a full-file checkpoint (one written by a single-device run) rekeys its optimiser
state by reading the first entry of ``state``; an optimiser that has not stepped yet (every batch so far flat, so
skipped) has none, and the load failed with ``IndexError``. Its ``param_groups`` say the same thing: read those.
"""

from __future__ import annotations

from typing import Any

import lightning.fabric.strategies.model_parallel as fabric_model_parallel

_original = fabric_model_parallel._rekey_optimizer_state_if_needed


def _rekey_optimizer_state_if_needed(optimizer_state_dict: dict[str, Any], module: Any) -> dict[str, Any]:
    if optimizer_state_dict["state"]:
        return _original(optimizer_state_dict, module)
    params = [p for group in optimizer_state_dict["param_groups"] for p in group["params"]]
    if not params or not isinstance(params[0], int):
        return optimizer_state_dict
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import OptimStateKeyType

    return FSDP.rekey_optim_state_dict(optimizer_state_dict, OptimStateKeyType.PARAM_NAME, module)


def apply() -> None:
    fabric_model_parallel._rekey_optimizer_state_if_needed = _rekey_optimizer_state_if_needed
