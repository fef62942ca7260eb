"""`GroupRecord`: a callback that appends, on every rank, the groups each rollout step trained to
``<default_root_dir>/groups/rank<r>.jsonl`` (the trajectory dump holds rank 0's share only). Tests add it with
``--trainer.callbacks+=support.group_record.GroupRecord``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L


class GroupRecord(L.Callback):
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        folder = Path(trainer.default_root_dir) / "groups"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "step": getattr(pl_module, "steps_done", trainer.global_step),
            "ranks": trainer.world_size,
            "groups": sorted({ep.group_key for ep in batch.episodes}),
        }
        with (folder / f"rank{trainer.global_rank}.jsonl").open("a") as f:
            f.write(json.dumps(record) + "\n")


def recorded(root: Path) -> list[dict[str, Any]]:
    """Every record under ``root``, each with its ``rank``."""
    out = []
    for path in sorted((root / "groups").glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        out += [{**json.loads(line), "rank": rank} for line in path.read_text().splitlines()]
    return out
