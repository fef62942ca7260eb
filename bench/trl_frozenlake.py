"""TRL's `GRPOTrainer` on our FrozenLake recipe: the TRL side of a roll_lightning vs TRL side-by-side.

    .venv/bin/python bench/trl_frozenlake.py --minutes 15 --out runs/trl_frozenlake [--seed 0]
    .venv/bin/python bench/trl_frozenlake.py --minutes 15 --out runs/trl_smollm2 --config configs/frozenlake_llm.yaml \
        --max-context-tokens 1024 --micro-episodes 4 [--no-held-out]

The settings come from one of our configs (`bench/trl_recipe.Recipe`: group size, batch, optimiser steps, lr,
advantage scaling, sampling, prompt, reply prefix, stop strings, bf16); what follows describes the default, the
tiny model's recipe. With ``configs/frozenlake_llm.yaml`` (SmolLM2) the replies are sampled by ``model.generate``
(TRL's own path without vLLM), cut at the ``</answer>`` stop string, and the reply prefix ``<answer>`` belongs to
the prompt side (``env_mask`` 0), as in ours.

The same model (``tiny-words``: Llama, hidden 64, 2 layers, 22-token vocabulary, random init, from
`roll_lightning.models.resolve`), the same env (our FrozenLake server, launched locally, with the recipe's config
``configs/frozenlake_learn.yaml``), the same boards (`roll_lightning.rollout.scheduling.ledger.group_seed`: group ``g``
of the run seed plays ``group_seed(seed, g, "train")``, even; the 128 held-out boards are
``group_seed(seed, i, "eval")``, odd) and the same budget in wall-clock minutes. roll_lightning is used only as a
library: the env server and its async client, the model builder, the seed function, and the chat rendering
(`rollout.prompts.chat.TokenHistory`, so every token id matches what our trainer builds).

How the episode loop fits TRL. `GRPOTrainer` plays multi-turn episodes only through tool calls, which a
22-word model cannot write, so the loop is a ``rollout_func`` (trl/trainer/grpo_trainer.py:258, called at :2210).
Each of its samples is one episode in TRL's multi-turn form: ``prompt_ids`` = the first board (ChatML user turn +
assistant header, 27 tokens), ``completion_ids`` = action, then the env's next turn (``<|im_end|>`` + the next
user turn + assistant header), action, ... with ``env_mask`` 1 on the sampled action tokens and 0 on the env's
tokens (trl/trainer/grpo_trainer.py:2272; TRL multiplies it into the loss mask, :2497). Each turn the trainer's
own model samples ONE token at temperature 1 from the full vocabulary (a direct forward pass + multinomial: the
same distribution as our `TransformersEngine`'s ``generate(max_new_tokens=1, top_k=0, top_p=1)``, no vLLM). The
reply text (special tokens skipped) goes to the env as the action. The episode return (sum of env rewards)
reaches TRL through the extra key ``episode_return`` and the reward function `episode_return_reward`.
TRL's sampler repeats each dataset row ``num_generations`` times in a row (trl/trainer/utils.py:859
`RepeatSampler`), and the rollout_func gets those copies: 64 prompts per call, 8 distinct (measured; the
docstring at trl/trainer/grpo_trainer.py:262 says it receives the prompts "with no duplication", which is not what
happens with the default sampler), and must return one sample per prompt, in order (advantages are computed over
``view(-1, num_generations)``, :2765). So a row is a group: its ``prompt`` is the board seed as text, and the 8
samples of a group share it (checked on every call). The dataset is not shuffled, so groups are played in the
order 0, 1, 2, ... like our ledger's.

Settings matched to the recipe: group size 8 (``num_generations``), 64 episodes per update (8 boards), AdamW
lr 5e-4 (betas 0.9/0.999, eps 1e-8, no weight decay), constant schedule, grad clip 1.0, PPO clip 0.2 both sides
(``epsilon``), 1 epoch per batch (``num_iterations=1``), 2 optimiser steps per batch (our ``mini_batches: 2``:
``per_device_train_batch_size=32``, ``steps_per_generation=2``; TRL shuffles the 64 episodes and splits them in
two, as ours shuffles rows), no KL (``beta=0``), no entropy bonus, GRPO advantage (return - group mean) / group
std (``scale_rewards="group"``), temperature 1.0, float32 on CPU (``use_cpu=True, bf16=False``), no gradient
checkpointing, no eval inside TRL, ``report_to="none"``, seed. ``loss_type="bnpo"``: the token losses summed over
a mini-batch and divided by that mini-batch's action-token count, which is our ``aggregation: token-mean``
(denominator = the whole mini-batch's response tokens). ``"dapo"`` would divide by half the count of the whole
64-episode batch instead (trl/trainer/grpo_trainer.py:3168-3173), which differs whenever the two halves hold
different numbers of turns.

What differs from the recipe, and why:
- Row layout. The recipe trains ``layout: step`` with ``history_turns: 0``: one row per turn whose prompt is only
  the current board. TRL has no per-turn rows for a multi-turn episode: one sample is one sequence, and its
  log-probs are recomputed over the whole prompt+completion, so each action here is conditioned on the full
  episode so far (our ``layout: trajectory``). The text of each turn is what ours renders (system prompt "",
  turn template "{observation}", no instruction, ChatML template, no reply prefix), but the model also sees the
  earlier turns. Sampling conditions on that same history, so TRL's training log-probs are exactly the sampling
  distribution. For a like-for-like run of ours, use ``--data.rollout.episode.layout trajectory`` with
  ``--data.rollout.episode.max_context_tokens 256`` (an 8-turn episode is 27 + 8 + 7 x 29 = 238 tokens; the
  recipe's 64 fits only step rows). With step rows both sides would sample the same distribution, but TRL would
  train on a different one (a 2-layer model that sees the history puts different probabilities on actions).
- Per-token weight. Ours (step rows) and TRL (one row per episode) both weigh every action token equally
  (token-mean), and both give every action of an episode the episode's advantage, so the objective is the same
  given the layout; only the conditioning context differs (above).
- Old log-probs. Ours takes the PPO ratio's denominator from the engine (``recompute_old_logprobs: false``). TRL
  ignores the ``logprobs`` a rollout_func returns except for vLLM importance sampling
  (trl/trainer/grpo_trainer.py:2642-2655) and instead makes an extra no-grad forward pass over the batch before
  the update whenever a generation serves more than one optimiser step (here 2). Same weights, same float32
  values, one extra forward per update.
- Batches without signal. Ours skips the optimiser step when every advantage is 0; TRL always steps (AdamW
  momentum still moves the weights with a zero gradient).
- Std epsilon: TRL adds 1e-4 to the group std, ours 1e-6 (groups with std 0 get advantage 0 in both).
- Evaluation. Ours evaluates through its engine; here `evaluate` plays the 128 held-out boards with the same
  per-turn prompts and the same trajectory context as training, temperature 1, with its own torch.Generator
  seeded from ``--seed`` (the same random stream at every evaluation).
- Run seed. ``--seed`` seeds TRL (model init is fixed by the model name) and is the run seed of `group_seed`; ours
  takes the board seeds from ``data.rollout.seed`` (default 0), not ``seed_everything``.
- TRL's own ``completions/clipped_ratio`` and ``*_terminated_length`` metrics count an episode as "truncated"
  when its last token is not an eos: here every episode ends on an action word, so those numbers mean nothing
  (``mask_truncated_completions`` is off, so nothing is masked because of it).
- Memory. ``peak_rss_mb`` is this process only (the env server is a child process). Importing `trl.GRPOTrainer`
  alone takes the process from ~250 MB to ~680 MB here (it imports the installed vLLM), before any model exists.
- Budget. ``--minutes`` counts from the first (elapsed 0) evaluation: evaluations and checkpoints count, model
  loading and TRL's trainer construction do not. An update in flight at the deadline is finished.

Output (``--out DIR``): ``DIR/trl_metrics.jsonl``, one JSON object per line: ``{"kind": "update", ...}`` per update
(``wall_s`` from the start of the step that generates to the end of the second optimiser step; ``rollout_s`` =
``gen_s`` model forward + sampling, ``env_s`` env resets and steps, rest bookkeeping; ``score_s`` TRL's scoring
after the rollout: padding, the old-log-prob forward, rewards, advantages; ``train_s`` = the two forward+backward
+optimiser steps and TRL's overhead; ``trl/*`` TRL's own logged metrics), ``{"kind": "eval", ...}`` at elapsed 0,
every ``--eval-every-s`` seconds and at the end, each with its checkpoint ``DIR/ckpt_<elapsed_s>``; and the last line
``{"kind": "summary", ...}``, also printed as one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental": we know
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from roll_lightning.env_client import EnvPool, EnvSession  # noqa: E402
from roll_lightning.env_client.local import launch_local_server  # noqa: E402
from roll_lightning.models.resolve import resolve_model  # noqa: E402
from roll_lightning.rollout.runtime.loop import RolloutLoop  # noqa: E402
from roll_lightning.rollout.scheduling.ledger import group_seed  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.trl_recipe import CLIP, EpisodeResult, PlayTimes, Recipe, play_episodes  # noqa: E402

TINY_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "frozenlake_learn.yaml"


# -- held-out play ------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    model: Any,
    tokenizer: Any,
    recipe: Recipe,
    pool: EnvPool,
    seeds: list[int],
    *,
    loop: RolloutLoop,
    sessions: list[EnvSession] | None = None,
    generator_seed: int = 0,
) -> dict[str, float]:
    """Held-out success rate of ``model``: one episode per seed, temperature 1, the training prompts.

    ``loop``: the loop ``pool`` lives on (the model runs in this thread, env calls there); ``sessions``: open
    sessions to play on (at least one per seed; None: open them on ``pool`` and close them after). Every call
    samples from a fresh generator seeded with ``generator_seed``.
    """
    own = sessions is None
    if own:
        sessions = loop.call(_open_sessions(pool, recipe, len(seeds)))
    was_training = model.training
    model.eval()
    try:
        generator = torch.Generator().manual_seed(generator_seed)
        results, times = play_episodes(
            model, tokenizer, recipe, sessions[: len(seeds)], seeds, loop.call, generator=generator
        )
    finally:
        model.train(was_training)
        if own:
            loop.call(_close_sessions(sessions))
    return _eval_summary(results, times)


async def _open_sessions(pool: EnvPool, recipe: Recipe, n: int) -> list[EnvSession]:
    return list(await asyncio.gather(*(pool.open(recipe.env_id, recipe.env_config) for _ in range(n))))


async def _close_sessions(sessions: list[EnvSession]) -> None:
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def _eval_summary(results: list[EpisodeResult], times: PlayTimes) -> dict[str, float]:
    n = len(results)
    return {
        "episodes": n,
        "success_rate": sum(r.success for r in results) / n,
        "mean_return": sum(r.ret for r in results) / n,
        "mean_turns": sum(r.turns for r in results) / n,
        "invalid_action_rate": sum(r.invalid for r in results) / max(1, sum(r.turns for r in results)),
        "eval_s": times.total_s,
    }


# -- TRL glue ------------------------------------------------------------------------------------------------


def episode_return_reward(
    prompts: list[Any], completions: list[Any], episode_return: list[float], **_: Any
) -> list[float]:
    """The reward TRL normalises per group: the episode's return, passed through from the rollout."""
    return [float(r) for r in episode_return]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class Bench:
    """The run's shared state: env loop and sessions, the per-update timing, the jsonl writer."""

    def __init__(
        self, args: argparse.Namespace, recipe: Recipe, tokenizer: Any, loop: RolloutLoop, pool: EnvPool
    ) -> None:
        self.args, self.recipe, self.tokenizer, self.loop, self.pool = args, recipe, tokenizer, loop, pool
        self.out = Path(args.out)
        self.metrics = open(self.out / "trl_metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        self.sessions: list[EnvSession] = []
        self.generator = torch.Generator().manual_seed(args.seed)
        self.eval_seeds = [group_seed(args.seed, i, "eval") for i in range(recipe.eval_episodes)]
        self.t0 = 0.0  # wall-clock start of the budget
        self.last_eval_t = 0.0
        self.update = 0
        self.pending: dict[str, Any] | None = None
        self.rollout: dict[str, Any] = {}
        self.update_started = 0.0
        self.gen_score_s = 0.0
        self.update_walls: list[float] = []
        self.totals = {"episodes": 0, "gen_tokens": 0, "env_steps": 0, "train_wall_s": 0.0}
        self.evals: list[dict[str, Any]] = []

    def open_sessions(self, n: int) -> None:
        self.sessions = self.loop.call(_open_sessions(self.pool, self.recipe, n))

    def write(self, record: dict[str, Any]) -> None:
        self.metrics.write(json.dumps(record) + "\n")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    # the rollout_func: one episode per prompt; prompts arrive as group_size copies of one seed in a row
    def rollout_func(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        g = trainer.num_generations
        if len(prompts) % g or any(prompts[k] != prompts[k - k % g] for k in range(len(prompts))):
            raise RuntimeError(f"rollout_func expected groups of {g} identical prompts, got {prompts}")
        seeds = [int(p) for p in prompts]
        if len(seeds) > len(self.sessions):
            raise RuntimeError(f"{len(seeds)} episodes asked for, {len(self.sessions)} sessions open")
        model = trainer.accelerator.unwrap_model(trainer.model)
        results, times = play_episodes(
            model, self.tokenizer, self.recipe, self.sessions[: len(seeds)], seeds, self.loop.call,
            generator=self.generator,
        )  # fmt: skip
        n = len(results)
        turns = sum(r.turns for r in results)
        self.rollout = {
            "episodes": n,
            "gen_tokens": sum(sum(r.env_mask) for r in results),
            "env_steps": turns,
            "mean_return": sum(r.ret for r in results) / n,
            "success_rate": sum(r.success for r in results) / n,
            "mean_turns": turns / n,
            "invalid_action_rate": sum(r.invalid for r in results) / max(1, turns),
            "mean_completion_len": sum(len(r.completion_ids) for r in results) / n,
            "boards": sorted(set(seeds)),
            "rollout_s": times.total_s,
            "gen_s": times.gen_s,
            "env_s": times.env_s,
        }
        return {
            "prompt_ids": [r.prompt_ids for r in results],
            "completion_ids": [r.completion_ids for r in results],
            "logprobs": [r.logprobs for r in results],
            "env_mask": [r.env_mask for r in results],
            "episode_return": [r.ret for r in results],
            "episode_success": [float(r.success) for r in results],
        }

    def run_eval(self, model: Any) -> None:
        elapsed = self.elapsed()
        ckpt = self.out / f"ckpt_{int(round(elapsed))}"
        model.save_pretrained(ckpt)
        self.tokenizer.save_pretrained(ckpt)
        stats = evaluate(
            model, self.tokenizer, self.recipe, self.pool, self.eval_seeds, loop=self.loop, sessions=self.sessions,
            generator_seed=self.args.seed,
        )  # fmt: skip
        record = {"kind": "eval", "elapsed_s": round(elapsed, 2), "update": self.update, "ckpt": str(ckpt), **stats}
        record["peak_rss_mb"] = round(peak_rss_mb(), 1)
        self.write(record)
        self.evals.append(record)
        print(
            f"[eval] elapsed {elapsed:.0f}s update {self.update}: held-out success {stats['success_rate']:.3f} "
            f"(return {stats['mean_return']:.3f}, {stats['eval_s']:.1f}s)",
            flush=True,
        )
        self.last_eval_t = time.perf_counter()

    def summary(self) -> dict[str, Any]:
        walls = self.update_walls
        train_s = self.totals["train_wall_s"]
        return {
            "kind": "summary",
            "updates": self.update,
            "median_s_per_update": round(statistics.median(walls), 3) if walls else None,
            "episodes_per_s": round(self.totals["episodes"] / train_s, 2) if train_s else None,
            "gen_tokens_per_s": round(self.totals["gen_tokens"] / train_s, 2) if train_s else None,
            "env_steps_per_s": round(self.totals["env_steps"] / train_s, 2) if train_s else None,
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "heldout_success_first": self.evals[0]["success_rate"] if self.evals else None,
            "heldout_success_last": self.evals[-1]["success_rate"] if self.evals else None,
            "elapsed_s": round(self.elapsed(), 1),
            "update_wall_s_total": round(train_s, 1),
        }


def make_trainer_class() -> type:
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer that times its generate-and-score phase (nothing else changes)."""

        bench: Bench

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            self.bench.gen_score_s = time.perf_counter() - t0
            return out

    return TimedGRPOTrainer


def make_callback(bench: Bench, steps_per_update: int) -> Any:
    from transformers import TrainerCallback

    class BenchCallback(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % steps_per_update == 0:
                bench.update_started = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % steps_per_update:
                return
            wall = time.perf_counter() - bench.update_started
            bench.update += 1
            ro = bench.rollout
            bench.update_walls.append(wall)
            bench.totals["train_wall_s"] += wall
            for key in ("episodes", "gen_tokens", "env_steps"):
                bench.totals[key] += ro[key]
            bench.pending = {
                "kind": "update",
                "update": bench.update,
                "elapsed_s": round(bench.elapsed(), 2),
                "wall_s": round(wall, 4),
                **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in ro.items()},
                "score_s": round(bench.gen_score_s - ro["rollout_s"], 4),
                "train_s": round(wall - bench.gen_score_s, 4),
                "peak_rss_mb": round(peak_rss_mb(), 1),
            }

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
        ) -> None:
            if bench.pending is None:
                return
            record, bench.pending = bench.pending, None
            for key, value in (logs or {}).items():
                if isinstance(value, (int, float)):
                    record[f"trl/{key}"] = value
            bench.write(record)
            print(
                f"[update {record['update']}] {record['wall_s']:.2f}s (gen {record['gen_s']:.2f} env "
                f"{record['env_s']:.2f} score {record['score_s']:.2f} train {record['train_s']:.2f}) return "
                f"{record['mean_return']:.3f} success {record['success_rate']:.3f} turns {record['mean_turns']:.2f}",
                flush=True,
            )
            now = time.perf_counter()
            if bench.elapsed() >= bench.args.minutes * 60:
                control.should_training_stop = True
            elif not bench.args.no_held_out and now - bench.last_eval_t >= bench.args.eval_every_s:
                bench.run_eval(kwargs["model"])

    return BenchCallback()


# -- main ----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock budget (evaluations included)")
    ap.add_argument("--out", required=True, help="output folder (trl_metrics.jsonl, ckpt_<elapsed_s>/)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: TRL's seed and group_seed's run seed")
    ap.add_argument("--config", default=str(TINY_CONFIG), help="our recipe whose settings TRL takes (`Recipe`)")
    ap.add_argument("--model", default=None, help="a resolve_model name or a local HF folder (default: the recipe's)")
    ap.add_argument(
        "--max-context-tokens", type=int, default=256, help="an episode's token budget (trajectory rows: 256 fits "
        "8 turns of the tiny recipe)",
    )  # fmt: skip
    ap.add_argument("--micro-episodes", type=int, default=None, help="episodes per forward+backward (default: a "
                    "mini-batch)")  # fmt: skip
    ap.add_argument("--eval-every-s", type=float, default=60.0, help="seconds between held-out evaluations")
    ap.add_argument("--no-held-out", action="store_true", help="no held-out play (a throughput-only run)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument(
        "--max-updates", type=int, default=10_000, help="dataset size in updates (8 boards each): a bound, not a goal"
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "trl_metrics.jsonl"
    if metrics_path.exists():
        metrics_path.unlink()  # one run per folder

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig

    recipe = Recipe.from_config(args.config, args.max_context_tokens, args.micro_episodes)
    model_path = resolve_model(args.model or recipe.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)  # bf16: autocast, as ours

    steps_per_update = recipe.mini_batches
    mini_episodes = recipe.batch_episodes // recipe.mini_batches
    accumulation = mini_episodes // recipe.micro_episodes
    config = GRPOConfig(
        output_dir=str(out / "trl_out"),
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        bf16=recipe.dtype == "bfloat16",
        fp16=False,
        gradient_checkpointing=False,
        # one update = a batch of episodes (e.g. 8 boards x 8), `mini_batches` optimiser steps, each accumulating
        # micro-batches of `micro_episodes`
        num_generations=recipe.group_size,
        per_device_train_batch_size=recipe.micro_episodes,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=recipe.mini_batches * accumulation,
        num_iterations=1,
        max_steps=args.max_updates * steps_per_update,
        shuffle_dataset=False,  # groups in order 0, 1, 2, ... like our ledger
        # the objective
        learning_rate=recipe.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        optim="adamw_torch",
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=CLIP,
        epsilon_high=CLIP,
        # our token-mean over a mini-batch: "bnpo" when a mini-batch is one micro-batch; "dapo" when the batch is
        # one mini-batch of several micro-batches (trl/trainer/grpo_trainer.py:3168-3173)
        loss_type="bnpo" if accumulation == 1 else "dapo",
        scale_rewards="group" if recipe.norm_by_std else "none",
        mask_truncated_completions=False,
        temperature=recipe.temperature,
        max_completion_length=recipe.max_context_tokens,
        # bookkeeping
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        logging_steps=steps_per_update,
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )

    dataset = Dataset.from_dict(
        {
            "prompt": [
                str(group_seed(args.seed, g, "train"))
                for g in range(args.max_updates * recipe.batch_episodes // recipe.group_size)
            ]
        }
    )

    server = launch_local_server([recipe.env_id])
    loop = RolloutLoop("trl-env-loop")
    pool = EnvPool([server.address])
    bench: Bench | None = None
    try:
        loop.call(pool.start())
        bench = Bench(args, recipe, tokenizer, loop, pool)
        bench.open_sessions(max(recipe.batch_episodes, recipe.eval_episodes))
        trainer_class = make_trainer_class()
        trainer = trainer_class(
            model=model,
            reward_funcs=[episode_return_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=bench.rollout_func,
        )
        trainer.bench = bench
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.add_callback(make_callback(bench, steps_per_update))

        bench.t0 = time.perf_counter()
        if not args.no_held_out:
            bench.run_eval(trainer.model)  # elapsed 0, like our at_fit_start
        trainer.train()
        if not args.no_held_out and (bench.evals[-1]["update"] != bench.update or len(bench.evals) == 1):
            bench.run_eval(trainer.model)  # the end
        summary = bench.summary()
        bench.write(summary)
        print(
            f"[summary] updates {summary['updates']}, median {summary['median_s_per_update']} s/update, "
            f"{summary['episodes_per_s']} episodes/s, {summary['gen_tokens_per_s']} generated tokens/s, "
            f"peak RSS {summary['peak_rss_mb']:.0f} MB, held-out success {summary['heldout_success_first']} -> "
            f"{summary['heldout_success_last']} (elapsed {summary['elapsed_s']:.0f}s)",
            flush=True,
        )
    finally:
        if bench is not None:
            bench.metrics.close()

            async def close_all() -> None:
                await _close_sessions(bench.sessions)
                await pool.close()

            try:
                loop.call(close_all(), timeout=60)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                print(f"closing the env pool: {exc!r}", file=sys.stderr)
        loop.close()
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
