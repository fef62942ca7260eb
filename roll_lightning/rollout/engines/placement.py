"""Where a rank's engine replicas run: ``data.engine.devices`` resolved for one rank.

Each entry is a replica: ``train`` (the rank's training device) or a device string with ``{...}`` expressions
of ``local_rank`` and ``local_world_size``, e.g. ``[train, "cuda:{local_rank + local_world_size}"]``.
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
    """One rank's replicas: ``labels[i]`` (named by `shrink`/`expand`) and ``devices[i]``."""

    labels: list[str]
    devices: list[str]


def device_rule(devices: Sequence[str]) -> str | None:
    """Why ``devices`` cannot work (None when it can), checked with rank 0's values."""
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
    """Resolve ``devices`` for this rank; without it, ``replicas`` replicas on ``device``."""
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
    """An integer expression with + - * //; nothing else is evaluated."""
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
