"""``model.algorithm.batch_adjust`` (ROLL's ``batch_adjust_mode``): rows that split into ``d`` equal mini-batches.

Every mode leaves at least d rows, so every rank takes d optimiser steps per epoch (collectives must match).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Adjuster = Callable[[int, int, torch.Generator], torch.Tensor]


def _keep(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    return torch.arange(n)


def _copy(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    extra = (-n) % d
    return torch.cat([torch.arange(n), torch.randint(n, (extra,), generator=generator)])


def _delete(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    keep = n - n % d
    if keep == 0:
        return _copy(n, d, generator)
    return torch.randperm(n, generator=generator)[:keep].sort().values


def _auto(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    return _copy(n, d, generator) if 2 * (n % d) >= d else _delete(n, d, generator)


def _random_sample(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
    if n < d:  # d draws from fewer rows could leave one out
        return _copy(n, d, generator)
    size = d * round(n / d)
    return torch.randint(n, (size,), generator=generator)


ADJUSTERS: dict[str, Adjuster] = {
    "none": _keep,
    "copy": _copy,
    "delete": _delete,
    "auto": _auto,
    "random_sample": _random_sample,
}


def adjuster(mode: str) -> Adjuster:
    """``(n, d, generator) -> row indices``, possibly repeated."""
    chosen = ADJUSTERS[mode]

    def adjust(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
        if n == 0:
            raise ValueError("a rollout batch with no rows cannot be trained on")
        rows = chosen(n, d, generator)
        if len(rows) < d:  # no part may be empty
            rows = torch.cat([rows, torch.randint(n, (d - len(rows),), generator=generator)])
        return rows

    return adjust
