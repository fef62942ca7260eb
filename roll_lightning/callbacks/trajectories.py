"""`TrajectoryDump`: every N rollout steps, write a sample of the batch's episodes as JSONL, plus a static viewer
(no network: serve the folder, or pick the files from ``file://``). Only global rank 0 writes its share.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import lightning as L

from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.rollout.episodes.episode import Episode
from roll_lightning.rollout.prompts.vision import PromptImage

log = logging.getLogger(__name__)

VIEWER = "viewer.html"
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def sample_episodes(episodes: Sequence[Episode], max_episodes: int) -> list[Episode]:
    """Up to ``max_episodes`` (<= 0: all), one per group first: deterministic, as many boards as can be."""
    if max_episodes <= 0 or max_episodes >= len(episodes):
        return list(episodes)
    groups: dict[str, list[Episode]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_key, []).append(ep)
    picked: list[Episode] = []
    rank = 0
    while len(picked) < max_episodes:
        for members in groups.values():
            if rank < len(members):
                picked.append(members[rank])
                if len(picked) == max_episodes:
                    break
        rank += 1
    return picked


def _jsonable(value: Any) -> Any:
    """JSON without NaN/Infinity (``JSON.parse`` rejects them); odd types become strings rather than crash a run."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def turn_advantages(batch: RolloutBatch, row_values: Sequence[float]) -> dict[tuple[str, int], float]:
    """``(traj_id, turn) -> advantage`` from per-row advantages; a trajectory row's turns share its value."""
    out: dict[tuple[str, int], float] = {}
    for traj, step, value in zip(batch.traj_id, batch.step.tolist(), row_values, strict=True):
        for turn in batch.layout.turns_of_row(int(step)):
            out[(traj, turn)] = float(value)
    return out


def _pictures(images: Sequence[PromptImage]) -> list[dict[str, str]]:
    """The env's encoded image bytes as base64 (not pixel values: the dump stays the size of the PNGs)."""
    return [{"media_type": i.media_type, "data": base64.b64encode(i.data).decode("ascii")} for i in images]


def episode_record(
    episode: Episode, step: int, tokenizer: Any = None, advantages: dict[tuple[str, int], float] | None = None
) -> dict[str, Any]:
    """One JSONL line. ``prompt`` keeps special tokens (the chat template shows); ``turn`` counts from 0; a
    turn's ``images`` are its own observation's, in ``<image>`` marker order."""
    prompt = None
    if tokenizer is not None and episode.turns:
        prompt = tokenizer.decode(episode.turns[0].prompt_ids, skip_special_tokens=False)
    record = {
        "step": step,
        "env_id": episode.env_id,
        "tag": episode.tag or episode.env_id,
        "group": episode.group_key,
        "traj": episode.traj_key,
        "seed": episode.seed,
        "member": episode.member,
        "episode_id": episode.episode_id,
        "end_reason": episode.end_reason,
        "score": episode.score,
        "success": bool(episode.metrics()["success"]),
        "policy_version": episode.policy_version,
        "prompt": prompt,
        "final_observation": episode.final_observation,
        "final_images": _pictures(episode.final_images),
        "turns": [
            {
                "turn": episode.first_turn + k,  # in the whole episode: a fork's follow its parent's
                "observation": turn.observation,
                "images": _pictures(turn.observation_images),
                "reply": turn.reply,
                "reply_prefix": turn.reply_prefix,
                "tool_results": [dataclasses.asdict(r) for r in turn.tool_results],
                "reward": turn.reward,
                "action_valid": turn.action_valid,
                "metrics": turn.metrics,
                "response_tokens": len(turn.response_ids),
                "finish_reason": turn.finish_reason,
                "policy_version": turn.policy_version,
                "versions": [list(v) for v in turn.versions],  # on_suspend: keep: [token offset, version] pieces
                # step rows key a turn by its index in the whole episode; a trajectory row's turns share one value
                "advantage": (advantages or {}).get(
                    (episode.traj_key, episode.first_turn + k), (advantages or {}).get((episode.traj_key, k))
                ),
            }
            for k, turn in enumerate(episode.turns)
        ],
        "branch": dataclasses.asdict(episode.branch) if episode.branch else None,  # where it was forked, if it was
    }
    return _jsonable(record)


def _write_atomic(path: Path, text: str) -> None:
    """Write then rename: a polling viewer never reads half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def viewer_html() -> str:
    return resources.files("roll_lightning.callbacks").joinpath(VIEWER).read_text(encoding="utf-8")


def write_index(directory: Path) -> list[str]:
    """Rewrite ``index.json`` from the step files present (a resumed run's earlier files stay listed)."""
    found = [(int(m.group(1)), p.name) for p in directory.iterdir() if (m := _STEP_FILE.match(p.name))]
    files = [name for _, name in sorted(found)]  # by number: names outgrow the padding past 999999
    _write_atomic(directory / "index.json", json.dumps({"files": files}, indent=1) + "\n")
    return files


class TrajectoryDump(L.Callback):
    """Sampled episodes as JSONL every ``every_n_steps`` rollout steps, with an HTML viewer."""

    def __init__(
        self,
        every_n_steps: int = 10,
        max_episodes: int = 8,
        dirpath: str | None = None,
        tokenizer_for_prompts: bool = True,
    ) -> None:
        """
        Args:
            every_n_steps: dump every n-th rollout step (counted from 1).
            max_episodes: episodes per dump, one per group first (0: all).
            dirpath: output folder; default ``{trainer.log_dir}/trajectories``.
            tokenizer_for_prompts: decode each episode's first prompt into the ``prompt`` field.
        """
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.max_episodes = max_episodes
        self.dirpath = dirpath
        self.tokenizer_for_prompts = tokenizer_for_prompts
        self.directory: Path | None = None
        self._last_step: int | None = None
        self._viewer_written = False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # on every rank: `trainer.log_dir` broadcasts, so rank 0 alone would hang
        root = self.dirpath or str(Path(trainer.log_dir or trainer.default_root_dir) / "trajectories")
        self.directory = Path(root)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        steps = getattr(pl_module, "steps_done", None)
        step = steps if isinstance(steps, int) else trainer.global_step
        # a skipped batch leaves the step as is: don't dump the previous batch again
        if step <= 0 or step % self.every_n_steps or step == self._last_step:
            return
        record = getattr(pl_module, "fit_record", None)
        rollout = getattr(record, "last_batch", None)
        if rollout is None and hasattr(batch, "episodes"):
            rollout = batch
        if rollout is None or not rollout.episodes:
            return
        self._last_step = step
        tokenizer = getattr(trainer.datamodule, "tokenizer", None) if self.tokenizer_for_prompts else None
        values = getattr(record, "last_row_advantages", None)
        advantages = (
            turn_advantages(rollout, values) if isinstance(values, list) and len(values) == len(rollout) else None
        )
        self.dump(rollout.episodes, step, tokenizer, default_root=trainer.default_root_dir, advantages=advantages)

    def dump(
        self,
        episodes: Sequence[Episode],
        step: int,
        tokenizer: Any = None,
        default_root: str | None = None,
        advantages: dict[tuple[str, int], float] | None = None,
    ) -> Path:
        """Write ``step_{step:06d}.jsonl``, ``index.json`` and (once per run) the viewer."""
        if self.directory is None:  # called outside `fit`
            self.directory = Path(self.dirpath or Path(default_root or ".") / "trajectories")
        self.directory.mkdir(parents=True, exist_ok=True)
        lines = [
            json.dumps(episode_record(ep, step, tokenizer, advantages), ensure_ascii=False, allow_nan=False)
            for ep in sample_episodes(episodes, self.max_episodes)
        ]
        path = self.directory / f"step_{step:06d}.jsonl"
        _write_atomic(path, "".join(f"{line}\n" for line in lines))
        if not self._viewer_written:  # replaces a viewer an older version left
            _write_atomic(self.directory / "index.html", viewer_html())
            self._viewer_written = True
        write_index(self.directory)
        log.debug("trajectory dump: %d episodes -> %s", len(lines), path)
        return path
