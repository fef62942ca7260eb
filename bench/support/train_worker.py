"""Training-throughput worker for bench/train_throughput.py (issue 5), and the synthetic rollout batches it trains on.

Run as ``python bench/support/train_worker.py CONFIG_JSON OUT_PREFIX`` (1 rank, or 2 CPU ranks under FSDP2 with
`ModelParallelStrategy` + gloo; Lightning starts rank 1 by re-running this same command). Every rank builds the
same episodes from the seed, collates its own groups (rank r of W plays groups r, r+W, ..., as the rollout
scheduler does, so each rank pads only to its own longest row) and fits `AgentRLModule` on that batch for a fixed
schedule of steps; each step switches ``module.algorithm`` to the step's variant (padded or packed), so the
variants run interleaved in one process on the same weights-in-motion. Each rank writes
``OUT_PREFIX.rank<r>.json`` with the wall time of every `AgentRLModule.update` call (no-grad pass if any, forward,
backward, optimiser step), between two barriers so that all ranks time the same interval.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from roll_lightning.rollout.episodes.batch import RolloutBatch, collate
from roll_lightning.rollout.episodes.episode import Episode, Turn
from roll_lightning.training import AlgorithmConfig

# -- the synthetic multi-turn batch ----------------------------------------------------------------------

MAX_CONTEXT = 2048  # the tiny models' max_position_embeddings, and the rollout's usual max_context_tokens
SPECIALS = 4  # token ids 0..3 are the special tokens of roll_lightning.models.tiny: keep random ids above them


def synthetic_episodes(groups: int, group_size: int, seed: int, vocab: int) -> list[Episode]:
    """Trajectory episodes with a multi-turn length distribution like the agent envs'.

    A group shares its first prompt (same seed: system prompt + instruction + first observation, 150-300
    tokens); each member then plays 2-10 turns (P(n) proportional to 0.7^(n-2): short episodes are common, long
    ones form the tail) of a 10-60 token reply followed by a 60-150 token observation, until the episode ends
    or the next turn would not fit the 2048-token context. Token ids are random within the vocab; behaviour
    log-probs are near -log(vocab) (what a random model gives), rewards are -0.1 per step plus 1 with
    probability 0.4 on the last turn.
    """
    rng = random.Random(seed)
    turn_weights = [0.7 ** (n - 2) for n in range(2, 11)]
    episodes: list[Episode] = []
    base_logp = -math.log(vocab)

    def ids(n: int) -> list[int]:
        return [rng.randrange(SPECIALS, vocab) for _ in range(n)]

    for g in range(groups):
        first_prompt = ids(rng.randint(150, 300))
        for member in range(group_size):
            turns_wanted = rng.choices(range(2, 11), weights=turn_weights)[0]
            turns: list[Turn] = []
            length = 0
            prompt = first_prompt
            for _ in range(turns_wanted):
                reply = ids(rng.randint(10, 60))
                if length + len(prompt) + len(reply) > MAX_CONTEXT:
                    break
                logprobs = [base_logp + rng.gauss(0.0, 0.1) for _ in reply]
                turn = Turn(prompt, reply, logprobs, "stop", 0, observation=f"g{g}")
                turn.reward = -0.1
                turns.append(turn)
                length += len(prompt) + len(reply)
                prompt = ids(rng.randint(60, 150))
            turns[-1].reward += 1.0 if rng.random() < 0.4 else 0.0
            episodes.append(Episode(group_index=g, member=member, seed=1000 + g, env_id="synthetic", turns=turns))
    return episodes


def rank_batch(episodes: list[Episode], rank: int, world: int, pad_id: int) -> RolloutBatch:
    """The rows rank ``rank`` of ``world`` trains on: whole groups r, r+W, ..., collated on their own."""
    mine = [ep for ep in episodes if ep.group_index % world == rank]
    return collate(mine, "trajectory", pad_id)


def plan_stats(batch: RolloutBatch, algorithm: AlgorithmConfig) -> dict[str, Any]:
    """What one gradient pass over ``batch`` computes under ``algorithm`` (mini_batches=1: every row, one plan),
    using the module's own planner: real tokens, computed tokens (rows x width per forward), largest forward."""
    lengths = batch.attention_mask.sum(-1).tolist()
    planner = algorithm.micro_batcher
    plans = planner.plan(lengths)
    width = batch.input_ids.shape[1]
    forwards = [len(p) * (width if planner.pads_to_batch else max(lengths[i] for i in p)) for p in plans]
    real = int(sum(lengths))
    computed = int(sum(forwards))
    return {
        "rows": len(lengths),
        "real_tokens": real,
        "computed_tokens": computed,
        "pad_fraction": 1 - real / computed,
        "forwards": len(plans),
        "largest_forward_tokens": max(forwards),
        "batch_width": width,
    }


# -- the worker ------------------------------------------------------------------------------------------


def main(config_path: str, out_prefix: str) -> None:
    import lightning as L

    from roll_lightning.training import OptimConfig
    from roll_lightning.training.module import AgentRLModule

    cfg = json.loads(Path(config_path).read_text())
    devices = int(cfg["devices"])
    variants = {name: AlgorithmConfig(**kw) for name, kw in cfg["variants"].items()}
    schedule: list[str] = cfg["schedule"]  # the variant of every step; the first `warmup` steps are not timed
    records: list[dict[str, Any]] = []

    class Timed(AgentRLModule):
        def update(self, batch: RolloutBatch) -> dict[str, float]:
            step = self.steps_done
            self.algorithm = variants[schedule[step]]
            self.trainer.strategy.barrier()
            ng = [0.0]
            original = self._no_grad_logprobs

            def timed_no_grad(*a: Any) -> torch.Tensor:
                t = time.perf_counter()
                out = original(*a)
                ng[0] += time.perf_counter() - t
                return out

            self._no_grad_logprobs = timed_no_grad  # type: ignore[method-assign]
            started = time.perf_counter()
            try:
                out = super().update(batch)
                self.trainer.strategy.barrier()
            finally:
                del self._no_grad_logprobs
            wall = time.perf_counter() - started
            records.append(
                {
                    "step": step,
                    "variant": schedule[step],
                    "warmup": step < cfg["warmup"],
                    "wall_s": wall,
                    "no_grad_s": ng[0],
                    **plan_stats(batch, self.algorithm),
                }
            )
            return out

    class Batches(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            rank = self.trainer.global_rank
            episodes = synthetic_episodes(cfg["groups"], cfg["group_size"], cfg["seed"], cfg["vocab"])
            full = rank_batch(episodes, rank, devices, cfg["pad_id"])
            warm_rows = cfg.get("warmup_rows")
            warm = full
            if warm_rows:  # the shortest rows: a cheap warm-up (first-call costs, not the batch's shapes)
                order = full.attention_mask.sum(-1).argsort()[:warm_rows].tolist()
                warm = full.select(order)
                warm = warm.truncate(int(warm.attention_mask.sum(-1).max()))
            steps = [warm] * cfg["warmup"] + [full] * (len(schedule) - cfg["warmup"])
            return torch.utils.data.DataLoader(_Steps(steps), batch_size=None)

    module = Timed(
        cfg["model_dir"], algorithm=variants[schedule[0]], optim=OptimConfig(lr=1e-6), rollout_steps=len(schedule)
    )
    strategy: Any = "auto"
    if devices > 1:
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = ModelParallelStrategy(
            data_parallel_size=devices, tensor_parallel_size=1, process_group_backend="gloo"
        )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_steps=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=cfg["root_dir"],
    )
    started = time.perf_counter()
    trainer.fit(module, datamodule=Batches())
    import resource

    out = {
        "rank": trainer.global_rank,
        "world": devices,
        "threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "fit_s": time.perf_counter() - started,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": records,
    }
    Path(f"{out_prefix}.rank{trainer.global_rank}.json").write_text(json.dumps(out, indent=2))


class _Steps(torch.utils.data.IterableDataset):
    def __init__(self, batches: list[RolloutBatch]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[RolloutBatch]:
        yield from self.batches


def variant_config(kind: str, *, k: int, budget: int, recompute: bool) -> dict[str, Any]:
    """AlgorithmConfig kwargs of a variant: ``padded`` (fixed, k rows per forward) or ``packed`` (token budget)."""
    common = {
        "estimator": "grpo",
        "loss": "ppo",
        "ppo_epochs": 1,
        "mini_batches": 1,
        "recompute_old_logprobs": recompute,
    }
    if kind == "padded":
        return {**common, "micro_batching": "fixed", "micro_batch_size": k}
    return {**common, "micro_batching": "token_budget", "max_tokens_per_micro": budget}


if __name__ == "__main__":
    main(*sys.argv[1:3])
