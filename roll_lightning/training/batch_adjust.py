"""Batch adjust modes: make a rollout batch's rows split into ``mini_batches`` equal parts.

ROLL's ``batch_adjust_mode``. A rollout batch holds a fixed number of groups, but its *rows* vary: step rows
(one per turn) and dynamic sampling change the count, and ``n`` rows rarely split evenly. For ``d`` mini-batches
and ``r = n mod d``:

    none           keep the n rows; the d parts differ by at most one row
    copy           add d - r rows drawn at random from the batch (duplicates)           -> n + d - r rows
    delete         drop r rows chosen at random                                         -> n - r rows
    auto           copy when r >= d / 2, else delete                                    -> the nearest multiple
    random_sample  draw the nearest multiple of d rows with replacement from the n rows -> a bootstrap batch

Every mode leaves at least ``d`` rows (a batch of fewer rows is copied up), so each epoch always takes exactly
``d`` optimiser steps: with several ranks the step counts must agree, or the collectives deadlock. The
advantages were computed before the adjustment, so a copied row repeats its own advantage and never shifts a
group's mean or standard deviation (ROLL adjusts before the advantages, which lets duplicates into the group
statistics). Copies weigh twice in the loss; deleted rows are not trained on this step.

A mode is chosen once: ``adjuster(mode)`` returns the function ``(n, d, generator) -> row indices``.
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
    if n < d:  # copied up like every mode: d draws from fewer rows could leave one out
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
    """The adjustment for ``mode``: row indices (possibly repeated) for ``n`` rows, at least ``d`` of them."""
    chosen = ADJUSTERS[mode]

    def adjust(n: int, d: int, generator: torch.Generator) -> torch.Tensor:
        if n == 0:
            raise ValueError("a rollout batch with no rows cannot be trained on")
        rows = chosen(n, d, generator)
        if len(rows) < d:  # fewer rows than parts: every mode copies up, so no part is empty
            rows = torch.cat([rows, torch.randint(n, (d - len(rows),), generator=generator)])
        return rows

    return adjust
