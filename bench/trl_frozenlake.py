"""TRL's `GRPOTrainer` on our FrozenLake recipe: the TRL side of a roll_lightning vs TRL side-by-side.

    .venv/bin/python bench/trl_frozenlake.py --minutes 15 --out runs/trl_frozenlake [--seed 0] [--model tiny-words]

The same model (``tiny-words``: Llama, hidden 64, 2 layers, 22-token vocabulary, random init, from
`roll_lightning.models.resolve`), the same env (our FrozenLake server, launched locally, with the recipe's config
``configs/frozenlake_learn.yaml``), the same boards (`roll_lightning.rollout.ledger.group_seed`: group ``g`` of the
run seed plays ``group_seed(seed, g, "train")``, even; the 128 held-out boards are ``group_seed(seed, i, "eval")``,
odd) and the same budget in wall-clock minutes. roll_lightning is used only as a library: the env server and its
async client, the model builder, the seed function, and the chat rendering (`rollout.chat.TokenHistory`, so every
token id matches what our trainer builds).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental": we know
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from roll_lightning.env_client import EnvPool, EnvSession  # noqa: E402
from roll_lightning.env_client.local import launch_local_server  # noqa: E402
from roll_lightning.models.resolve import resolve_model  # noqa: E402
from roll_lightning.rollout.chat import TokenHistory  # noqa: E402
from roll_lightning.rollout.ledger import group_seed  # noqa: E402
from roll_lightning.rollout.loop import RolloutLoop  # noqa: E402

ENV_ID = "frozenlake"
# configs/frozenlake_learn.yaml, data.rollout
ENV_CONFIG = {"size": 4, "is_slippery": False, "max_steps": 8, "lenient": True, "format_penalty": -0.1}
GROUP_SIZE = 8  # data.rollout.group_size
BATCH_EPISODES = 64  # data.rollout.batch_size
MINI_BATCHES = 2  # model.algorithm.mini_batches
LR = 5.0e-4  # model.optim.lr
CLIP = 0.2  # the ppo loss's default clip_low / clip_high
TEMPERATURE = 1.0  # data.rollout.episode.sampling.temperature (and data.evaluation.temperature)
MAX_TURNS = 8  # data.rollout.episode.max_turns
EVAL_EPISODES = 128  # data.evaluation.episodes
MAX_CONTEXT_TOKENS = 256  # an 8-turn trajectory is 238 tokens on a 4x4 board (the recipe's 64 is for step rows)


# -- episodes ------------------------------------------------------------------------------------------------


@dataclass
class EpisodeResult:
    seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1: a sampled token, 0: the env's
    logprobs: list[float] = field(default_factory=list)  # the sampled tokens' log-probs, 0.0 on the env's
    ret: float = 0.0
    success: bool = False
    turns: int = 0
    invalid: int = 0


@dataclass
class PlayTimes:
    gen_s: float = 0.0
    env_s: float = 0.0
    total_s: float = 0.0


@torch.no_grad()
def play_episodes(
    model: Any,
    tokenizer: Any,
    sessions: list[EnvSession],
    seeds: list[int],
    run: Any,
    *,
    generator: torch.Generator,
    temperature: float = TEMPERATURE,
    max_turns: int = MAX_TURNS,
    max_context_tokens: int = MAX_CONTEXT_TOKENS,
) -> tuple[list[EpisodeResult], PlayTimes]:
    """Play one episode per seed in lock-step (one batched forward per turn, one concurrent env step per turn).

    ``run(coro)`` runs a coroutine on the env loop and returns its result. Each turn's context is the episode's
    whole conversation so far, rendered by our `TokenHistory` (ChatML; the reply ids appended as sampled).
    """
    times = PlayTimes()
    started = time.perf_counter()
    stop_ids = {tokenizer.eos_token_id}
    pad_id = tokenizer.pad_token_id
    device = next(model.parameters()).device
    t0 = time.perf_counter()
    resets = run(_gather([s.reset(seed=seed) for s, seed in zip(sessions, seeds, strict=False)]))
    times.env_s += time.perf_counter() - t0
    histories = [TokenHistory(tokenizer) for _ in seeds]
    results = []
    for seed, history, reset in zip(seeds, histories, resets, strict=True):
        results.append(EpisodeResult(seed, list(history.add_user(reset.observation))))
    active = list(range(len(seeds)))
    for _turn in range(max_turns):
        active = [i for i in active if len(histories[i].ids) < max_context_tokens]  # our "context" end
        if not active:
            break
        t0 = time.perf_counter()
        lengths = torch.tensor([len(histories[i].ids) for i in active])
        width = int(lengths.max())
        input_ids = torch.full((len(active), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(active), width), dtype=torch.long)
        for row, i in enumerate(active):  # right padding: causal attention keeps the real positions exact
            input_ids[row, : lengths[row]] = torch.tensor(histories[i].ids)
            attention[row, : lengths[row]] = 1
        logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
        last = logits[torch.arange(len(active)), (lengths - 1).to(device)].float().cpu() / temperature
        logp = torch.log_softmax(last, dim=-1)
        tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        token_logp = logp.gather(1, tokens.unsqueeze(1)).squeeze(1)
        actions = []
        for row, i in enumerate(active):
            token = int(tokens[row])
            histories[i].add_reply([token], stop_ids)
            results[i].completion_ids.append(token)
            results[i].env_mask.append(1)
            results[i].logprobs.append(float(token_logp[row]))
            actions.append(tokenizer.decode([token], skip_special_tokens=True))  # what our runner sends
        times.gen_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        outcomes = run(_gather([sessions[i].step(a) for i, a in zip(active, actions, strict=True)]))
        times.env_s += time.perf_counter() - t0
        still = []
        for i, out in zip(active, outcomes, strict=True):
            result = results[i]
            result.ret += out.reward
            result.turns += 1
            result.invalid += not out.action_valid
            if out.done:
                result.success = out.metrics.get("success", 0.0) > 0  # the env's flag: the player is on G
                continue
            if result.turns < max_turns:  # the next turn's prompt delta belongs to the completion (env_mask 0)
                delta = list(histories[i].add_user(out.observation))
                result.completion_ids += delta
                result.env_mask += [0] * len(delta)
                result.logprobs += [0.0] * len(delta)
            still.append(i)
        active = still
    times.total_s = time.perf_counter() - started
    return results, times


def evaluate(
    model: Any,
    tokenizer: Any,
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
        sessions = loop.call(_open_sessions(pool, len(seeds)))
    was_training = model.training
    model.eval()
    try:
        generator = torch.Generator().manual_seed(generator_seed)
        results, times = play_episodes(model, tokenizer, sessions[: len(seeds)], seeds, loop.call, generator=generator)
    finally:
        model.train(was_training)
        if own:
            loop.call(_close_sessions(sessions))
    return _eval_summary(results, times)


async def _gather(coros: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*coros))


async def _open_sessions(pool: EnvPool, n: int) -> list[EnvSession]:
    return list(await asyncio.gather(*(pool.open(ENV_ID, ENV_CONFIG) for _ in range(n))))


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

    def __init__(self, args: argparse.Namespace, tokenizer: Any, loop: RolloutLoop, pool: EnvPool) -> None:
        self.args, self.tokenizer, self.loop, self.pool = args, tokenizer, loop, pool
        self.out = Path(args.out)
        self.metrics = open(self.out / "trl_metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        self.sessions: list[EnvSession] = []
        self.generator = torch.Generator().manual_seed(args.seed)
        self.eval_seeds = [group_seed(args.seed, i, "eval") for i in range(args.eval_episodes)]
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
        self.sessions = self.loop.call(_open_sessions(self.pool, n))

    def write(self, record: dict[str, Any]) -> None:
        self.metrics.write(json.dumps(record) + "\n")

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    # the rollout_func: one episode per prompt; prompts arrive as GROUP_SIZE copies of one seed in a row
    def rollout_func(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        g = trainer.num_generations
        if len(prompts) % g or any(prompts[k] != prompts[k - k % g] for k in range(len(prompts))):
            raise RuntimeError(f"rollout_func expected groups of {g} identical prompts, got {prompts}")
        seeds = [int(p) for p in prompts]
        if len(seeds) > len(self.sessions):
            raise RuntimeError(f"{len(seeds)} episodes asked for, {len(self.sessions)} sessions open")
        model = trainer.accelerator.unwrap_model(trainer.model)
        results, times = play_episodes(
            model, self.tokenizer, self.sessions[: len(seeds)], seeds, self.loop.call, generator=self.generator
        )
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
            model, self.tokenizer, self.pool, self.eval_seeds, loop=self.loop, sessions=self.sessions,
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
            elif now - bench.last_eval_t >= bench.args.eval_every_s:
                bench.run_eval(kwargs["model"])

    return BenchCallback()


# -- main ----------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, required=True, help="wall-clock budget (evaluations included)")
    ap.add_argument("--out", required=True, help="output folder (trl_metrics.jsonl, ckpt_<elapsed_s>/)")
    ap.add_argument("--seed", type=int, default=0, help="run seed: TRL's seed and group_seed's run seed")
    ap.add_argument("--model", default="tiny-words", help="a resolve_model name or a local HF folder")
    ap.add_argument("--eval-every-s", type=float, default=60.0, help="seconds between held-out evaluations")
    ap.add_argument("--eval-episodes", type=int, default=EVAL_EPISODES)
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

    model_path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    steps_per_update = MINI_BATCHES
    config = GRPOConfig(
        output_dir=str(out / "trl_out"),
        seed=args.seed,
        data_seed=args.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        # one update = 64 episodes (8 boards x 8), 2 optimiser steps of 32 episodes
        num_generations=GROUP_SIZE,
        per_device_train_batch_size=BATCH_EPISODES // MINI_BATCHES,
        gradient_accumulation_steps=1,
        steps_per_generation=MINI_BATCHES,
        num_iterations=1,
        max_steps=args.max_updates * steps_per_update,
        shuffle_dataset=False,  # groups in order 0, 1, 2, ... like our ledger
        # the objective
        learning_rate=LR,
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
        loss_type="bnpo",
        scale_rewards="group",
        mask_truncated_completions=False,
        temperature=TEMPERATURE,
        max_completion_length=MAX_CONTEXT_TOKENS,
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
                str(group_seed(args.seed, g, "train")) for g in range(args.max_updates * BATCH_EPISODES // GROUP_SIZE)
            ]
        }
    )

    server = launch_local_server([ENV_ID])
    loop = RolloutLoop("trl-env-loop")
    pool = EnvPool([server.address])
    bench: Bench | None = None
    try:
        loop.call(pool.start())
        bench = Bench(args, tokenizer, loop, pool)
        bench.open_sessions(max(BATCH_EPISODES, args.eval_episodes))
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
        bench.run_eval(trainer.model)  # elapsed 0, like our at_fit_start
        trainer.train()
        if bench.evals[-1]["update"] != bench.update or len(bench.evals) == 1:
            bench.run_eval(trainer.model)  # the end
        summary = bench.summary()
        bench.write(summary)
        print(
            f"[summary] updates {summary['updates']}, median {summary['median_s_per_update']} s/update, "
            f"{summary['episodes_per_s']} episodes/s, {summary['gen_tokens_per_s']} generated tokens/s, "
            f"peak RSS {summary['peak_rss_mb']:.0f} MB, held-out success {summary['heldout_success_first']:.3f} -> "
            f"{summary['heldout_success_last']:.3f} (elapsed {summary['elapsed_s']:.0f}s)",
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
