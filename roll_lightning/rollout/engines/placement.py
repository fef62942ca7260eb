"""Where a rank's engine replicas run: ``data.engine.devices`` resolved for one rank.

Each entry is one replica. ``train`` is the device this rank trains on (shared with training: the replica a
partial-overlap run shrinks during each update, see `EngineRouter.shrink`); any other entry is a device string
(``cpu``, ``cuda``, ``cuda:N``) in which ``{...}`` is an integer expression of ``local_rank`` and
``local_world_size``, so one YAML serves every rank. Four ranks training on GPUs 0-3 that each also generate on
one of GPUs 4-7 write::

    devices: [train, "cuda:{local_rank + local_world_size}"]

The label a replica answers to in `shrink`/`expand` is ``train`` for the shared one and its device otherwise.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass

TRAIN = "train"
_DEVICE = re.compile(r"^(cpu|cuda)(:\d+)?$")
_TEMPLATE = re.compile(r"\{([^{}]*)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


@dataclass(frozen=True)
class Placement:
    """One rank's replicas: ``labels[i]`` names replica i in `shrink`/`expand`, ``devices[i]`` is where it runs."""

    labels: list[str]
    devices: list[str]


def device_rule(devices: Sequence[str]) -> str | None:
    """Why ``devices`` cannot work (None when it can): checked at config time, with rank 0's values."""
    if not devices:
        return "a non-empty list (one device per replica), or null"
    for entry in devices:
        if entry == TRAIN:
            continue
        try:
            resolved = _fill(entry, local_rank=0, local_world_size=1)
        except ValueError as err:
            return f"'train' or a device string: {err}"
        if not _DEVICE.match(resolved):
            return f"'train' or a device string (cpu, cuda, cuda:N, with {{local_rank}} expressions): got {entry!r}"
    return None


def place(
    devices: Sequence[str] | None,
    replicas: int,
    device: str,
    *,
    train_device: str,
    local_rank: int = 0,
    local_world_size: int = 1,
) -> Placement:
    """Resolve ``devices`` for this rank; without it, ``replicas`` replicas on ``device`` (labelled
    ``replica<i>``: nothing to shrink)."""
    if devices is None:
        return Placement([f"replica{i}" for i in range(replicas)], [device] * replicas)
    resolved = [
        train_device if entry == TRAIN else _fill(entry, local_rank=local_rank, local_world_size=local_world_size)
        for entry in devices
    ]
    labels = [TRAIN if entry == TRAIN else where for entry, where in zip(devices, resolved, strict=True)]
    return Placement(labels, resolved)


def _fill(entry: str, **names: int) -> str:
    """``entry`` with each ``{expression}`` replaced by its integer value."""
    return _TEMPLATE.sub(lambda m: str(_evaluate(m.group(1), names)), entry)


def _evaluate(text: str, names: dict[str, int]) -> int:
    """An integer expression of ``names`` with + - * // and integer literals (nothing else is evaluated)."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"{{{text}}} is not an expression") from err

    def value(node: ast.expr) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"{{{text}}}: only integers, {', '.join(names)} and + - * // are allowed")

    return value(tree)
