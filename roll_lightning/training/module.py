"""`AgentRLModule`: the policy update of agentic RL as a LightningModule, single-process, DDP or FSDP2.

Forwards and backwards are collectives, so ranks agree on every micro-batch count; a rank with fewer rows runs
zero-weight passes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch

from roll_lightning.algorithms import Estimator
from roll_lightning.algorithms.aggregation import masked_mean
from roll_lightning.algorithms.correction import importance_weights
from roll_lightning.algorithms.objective import ADDITIVE, Divisors, MicroInputs, Objective
from roll_lightning.models.precision import DTYPES, resolve_dtype
from roll_lightning.rollout.datamodule import rollout_of
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.rollout.handover import HandoffPlan, Handover
from roll_lightning.settings import check
from roll_lightning.training.batch_adjust import adjuster
from roll_lightning.training.config import AlgorithmConfig, LoraConfig, OptimConfig, TrainingConfigError
from roll_lightning.training.device_ops import DeviceOps, TorchDeviceOps
from roll_lightning.training.estimate import estimate_advantages
from roll_lightning.training.eval_report import EvalReport, FitRecord, episode_lines, gathered, held_out
from roll_lightning.training.forward import MicroBatching, ValueModel, policy_forward, trim
from roll_lightning.training.sharding import shard_fsdp2
from roll_lightning.training.update_guard import Snapshot, update_kl
from roll_lightning.training.weights import policy_update

log = logging.getLogger(__name__)

MAXIMA = frozenset({"is_weight_max"})  # step value: the largest, not the mean
# train/logprob_gap above this (nats per reply token) means the engine samples from other weights than the
# trainer's; bf16 on either side measures ~0.03, float32 on both ~1e-4 (docs/training.md, "Log-prob gap")
LOGPROB_GAP_WARNING = 0.1


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
            model: a model folder or ``tiny``, ``tiny-words``, ``tiny-grid``, ``smollm2-135m-instruct`` (``:SEED``).
            algorithm: advantages, loss, epochs, micro-batching, KL, entropy.
            optim: AdamW and the learning-rate schedule (in rollout steps).
            dtype: ``float32``, ``bfloat16`` or ``auto`` compute (bf16 where the training device computes it in
                hardware: `roll_lightning.models.precision`); trainable weights stay float32.
            rollout_steps: stop after this many rollout batches (None: trainer.max_steps decides).
            seed: seeds the mini-batch shuffling.
            sync_bucket_bytes: the most bytes per weight-sync bucket.
            lora: LoRA adapters on the policy (``rank: 0`` trains every weight).
        """
        super().__init__()
        self.model_path = model
        self.algorithm = algorithm
        self.objective: Objective = algorithm.objective
        self.estimator: Estimator = algorithm.advantage_estimator
        self.micro_batcher: MicroBatching = algorithm.micro_batcher
        self.optim = optim
        self.dtype_setting = dtype
        self.compute_dtype = dtype  # ``auto`` resolved in `setup`, on the device the trainer chose
        given = SimpleNamespace(rollout_steps=rollout_steps, dtype=dtype, sync_bucket_bytes=sync_bucket_bytes)
        rules = {  # rollout_steps 0 or -1 would train one step and exit 0
            "rollout_steps": (
                rollout_steps is None or rollout_steps >= 1,
                ">= 1, or null (trainer.max_steps decides)",
            ),
            "dtype": (dtype in DTYPES, " or ".join(DTYPES)),
            "sync_bucket_bytes": (sync_bucket_bytes >= 1, ">= 1"),
        }
        check("model", given, rules, TrainingConfigError)
        self.rollout_steps_limit = rollout_steps
        self.seed = seed
        self.lora = lora
        if lora.enabled:
            from roll_lightning.training.lora import keep_only_adapters

            keep_only_adapters(self)
        self.automatic_optimization = False
        self._adjust = adjuster(algorithm.batch_adjust)
        self.actor: torch.nn.Module | None = None
        self.critic: ValueModel | None = None
        self.reference: torch.nn.Module | None = None
        self.steps_done = 0  # rollout batches trained on
        self.sync_bucket_bytes = int(sync_bucket_bytes)
        self.device_ops: DeviceOps = TorchDeviceOps()  # a seam: tests take the CUDA branches on a CPU
        self.handover: Handover | None = None  # the rollout's engine turns (`setup`); None without a rollout
        self.fit_record = FitRecord()
        self._gap_warned = False
        self._time_fraction = 0.0  # of trainer.max_time, when the LR schedule spans the run

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
        self.actor.train()
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
        if self.device_mesh is not None:  # ModelParallelStrategy
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
        self._check_schedule_span()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self._lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _check_schedule_span(self) -> None:
        """A cosine without ``total_steps`` spans the run, which needs an end."""
        if self.optim.schedule == "constant" or self.optim.total_steps is not None or self.rollout_steps_limit:
            return
        if self._trainer is None or run_time_fraction(self.trainer) is None:
            raise TrainingConfigError(
                "model.optim.schedule cosine spans model.optim.total_steps rollout steps, or the run when that is "
                "null; this run has no end to span: set model.optim.total_steps, model.rollout_steps or "
                "trainer.max_time"
            )

    def _lr_factor(self, step: int) -> float:
        """The schedule's multiplier after ``step`` rollout steps; the run's progress is the larger of its steps'
        and its time budget's fraction (the latter agreed by all ranks in `_step_schedule`)."""
        by_steps = step / self.rollout_steps_limit if self.rollout_steps_limit else 0.0
        return self.optim.factor(step, max(by_steps, self._time_fraction))

    def _step_schedule(self) -> None:
        """The learning rate for the next rollout step, the same on every rank."""
        if self.optim.schedule != "constant" and self.optim.total_steps is None:
            fraction = run_time_fraction(self.trainer) or 0.0
            self._time_fraction = self._world_reduce((fraction,), torch.distributed.ReduceOp.MAX)[0]
        self.lr_schedulers().step()

    # -- the step ------------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        self.compute_dtype = resolve_dtype(self.dtype_setting, self.trainer.strategy.root_device.type)
        rollout = rollout_of(self.trainer)
        self.handover = rollout.handover if rollout is not None else None

    def training_step(self, dataloader_iter: Iterator[Any]) -> None:
        """1. optimiser state off the device while the engine generates; 2. the rollout, pulled here, never ahead of
        the weights; 3. pause: the engine steps aside, the optimiser state comes back; 4. the update; 5. publish:
        the new weights into the engine; 6. metrics, logged once."""
        plan = self._handoff_plan()
        self._move_optimizer_state(plan, "cpu")  # 1
        started = time.perf_counter()
        batch, _, _ = next(dataloader_iter)  # 2
        rollout_s = time.perf_counter() - started
        metrics = self._pause(plan)  # 3
        batch = batch.to(self.device)
        self.fit_record.last_batch, self.fit_record.last_row_advantages = batch, None
        started = time.perf_counter()
        autocast = self.compute_dtype == "bfloat16" and self.device_mesh is None  # FSDP2 casts by itself
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=autocast):
            metrics.update(self.update(batch))  # 4
        metrics["timing/train_s"] = time.perf_counter() - started
        metrics["timing/rollout_wait_s"] = rollout_s
        metrics.update({k: v for k, v in batch.metrics.items()})
        metrics["timing/step_s"] = rollout_s + metrics["timing/train_s"]
        self.steps_done += 1
        metrics.update(self._publish())  # 5
        metrics["timing/elapsed_s_total"] = time.perf_counter() - self.fit_record.started
        self.log_dict({k: float(v) for k, v in metrics.items()}, on_step=True, batch_size=len(batch))  # 6
        # loggers read their x axis from "step"
        self.log("step", float(self.steps_done), on_step=True, batch_size=len(batch))
        if self.stopping:
            self.trainer.should_stop = True

    # -- the engine's turns (rollout.handover) -------------------------------------------------------

    def _handoff_plan(self) -> HandoffPlan | None:
        if self.handover is None:
            return None
        return self.handover.plan(torch.device(self.device_ops.device(self)).type)

    def _move_optimizer_state(self, plan: HandoffPlan | None, device: torch.device | str) -> None:
        if plan is not None and plan.offload_optimizer:
            for optimizer in self.trainer.optimizers:
                self.device_ops.move_optimizer_state(optimizer, device)

    def _pause(self, plan: HandoffPlan | None) -> dict[str, float]:
        """The engine sleeps (or its `train` replicas shrink); the optimiser state comes back."""
        if self.handover is None or plan is None or not plan.pauses:
            return {}  # disaggregated: generation goes on
        started = time.perf_counter()
        device = self.device_ops.device(self)
        out = self.handover.pause(plan, self.device_ops.free_memory, str(device))
        self._move_optimizer_state(plan, device)
        if plan.synchronize:
            self.device_ops.synchronize()
        out["timing/handoff_s"] = time.perf_counter() - started
        return out

    def _publish(self) -> dict[str, float]:
        """The actor's weights into the engine as this policy version (`Handover.publish`)."""
        if self.handover is None or self.actor is None:
            return {}
        adapters = self.handover.takes_adapters
        update = policy_update(self.actor, adapters=adapters, bucket_bytes=self.sync_bucket_bytes)
        return self.handover.publish(update, self.policy_version)

    def _catch_up(self) -> None:
        """A restored checkpoint reaches the engine before it plays (every rank decides alike)."""
        if self.handover is not None and self.handover.engine_version != self.policy_version:
            behind = self.handover.engine_version
            self._publish()
            log.warning("the engine had policy version %d; loaded the restored %d", behind, self.policy_version)

    # -- the update ----------------------------------------------------------------------------------

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        """All optimiser steps for one rollout batch; a batch with no signal is skipped."""
        algo = self.algorithm
        out: dict[str, float] = {}
        opt = self.optimizers()
        with torch.no_grad():
            values = self._no_grad_values(batch) if self.critic is not None else None
            advantages, returns = estimate_advantages(batch, self.estimator, values)
            silent = _silent_rows(advantages, batch)
            out["train/advantage_mean"] = float(masked_mean(_tokens(advantages, batch), batch.response_mask))
            out["train/zero_advantage_share"] = float(silent.float().mean())
            self.fit_record.last_row_advantages = row_advantages(advantages, batch).tolist()
            nothing = bool(silent.all()) and algo.kl_coef == 0 and algo.entropy_coef == 0 and self.critic is None
            if self._on_every_rank(nothing):
                return {**out, **self._skip_update(opt)}
            from_update = algo.old_logprobs_from_update  # the first forward, detached, is the old policy
            recompute = algo.recompute_old_logprobs and not from_update
            trainer_logp = self._no_grad_logprobs(self.actor, batch) if recompute else None
            old_logp = trainer_logp if trainer_logp is not None else batch.behaviour_logprobs
            correction = None
            if trainer_logp is not None:
                mask = batch.response_mask
                out["train/logprob_gap"] = masked_mean((trainer_logp - batch.behaviour_logprobs).abs(), mask)
                c = algo.correction  # always measured; applied unless mode is none
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
                old_from_forward=from_update,
            )
        out["train/update_skipped"] = 0.0
        snapshot = Snapshot.take(self, _unwrapped(opt)) if algo.max_update_kl is not None else None
        sums: dict[str, float] = defaultdict(float)
        steps = 0
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.steps_done)
        rows = self._adjust(len(batch), algo.mini_batches, generator)
        out["train/rows"] = float(len(rows))
        for _epoch in range(algo.ppo_epochs):
            order = rows[torch.randperm(len(rows), generator=generator)]
            for mini in torch.tensor_split(order, algo.mini_batches):  # the same step count on every rank
                step_inputs = dataclasses.replace(inputs, measure_gap=trainer_logp is None and steps == 0)
                step_metrics = self._optimizer_step(opt, batch, mini.tolist(), step_inputs)
                if "train/logprob_gap" in step_metrics:  # first step only: not averaged
                    out["train/logprob_gap"] = step_metrics.pop("train/logprob_gap")
                for k, v in step_metrics.items():
                    sums[k] += v
                steps += 1
        if snapshot is not None:
            out.update(self._undo_if_far(snapshot, opt, batch, old_logp))
        self._step_schedule()
        out.update({k: v / steps for k, v in sums.items()})
        out["train/lr"] = opt.param_groups[0]["lr"]
        self._check_gap(out.get("train/logprob_gap"))
        return out

    def _undo_if_far(
        self, snapshot: Snapshot, opt: Any, batch: RolloutBatch, old_logp: torch.Tensor
    ) -> dict[str, float]:
        """``max_update_kl``: the policy's KL from the sampling policy after this update, over the whole batch (all
        ranks); above the bound the update is undone, weights and optimiser state alike (`update_guard`)."""
        sums = update_kl(old_logp, self._no_grad_logprobs(self.actor, batch), batch.response_mask)
        total, count = self._world_reduce(sums, torch.distributed.ReduceOp.SUM)
        kl = total / max(count, 1.0)
        undone = kl > self.algorithm.max_update_kl
        if undone:
            snapshot.restore(self, _unwrapped(opt))
        return {"train/update_kl": kl, "train/update_undone": float(undone)}

    def _check_gap(self, gap: float | torch.Tensor | None) -> None:
        """Warn once per fit when the engine's log-probs are far from the trainer's."""
        if gap is None or float(gap) <= LOGPROB_GAP_WARNING or self._gap_warned:
            return
        from lightning.pytorch.utilities import rank_zero_warn

        self._gap_warned = True
        rank_zero_warn(
            f"train/logprob_gap is {float(gap):.3f} nats per reply token at rollout step {self.steps_done + 1} "
            f"(above {LOGPROB_GAP_WARNING}): the engine samples from other weights than the trainer's. A weight "
            "sync that did not take, or data.engine.dtype far from model.dtype (warned once)"
        )

    def _skip_update(self, opt: Any) -> dict[str, float]:
        """No-op steps (no gradients), so the step count and LR schedule go on."""
        opt.zero_grad(set_to_none=True)
        for _ in range(self.algorithm.ppo_epochs * self.algorithm.mini_batches):
            opt.step()
        self._step_schedule()
        return {"train/update_skipped": 1.0, "train/lr": opt.param_groups[0]["lr"]}

    def _on_every_rank(self, flag: bool) -> bool:
        """``flag`` on all ranks (they must branch alike around collectives)."""
        return self._world_reduce((int(flag),), torch.distributed.ReduceOp.MIN)[0] == 1

    def _world_max(self, value: int) -> int:
        return int(self._world_reduce((value,), torch.distributed.ReduceOp.MAX)[0])

    def _world_reduce(self, values: tuple[float, ...], op: Any) -> list[float]:
        """``values`` reduced over all ranks in one collective (float64: counts stay exact)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(tensor, op=op)
        return tensor.tolist()

    def _optimizer_step(self, opt: Any, batch: RolloutBatch, rows: list[int], inputs: UpdateInputs) -> dict[str, float]:
        algo = self.algorithm
        objective = self.objective
        mask = batch.response_mask
        policy_mask = inputs.policy_mask
        divisors = objective.divisors(mask[rows], policy_mask[rows] if policy_mask is not None else None)
        total_tokens = float(mask[rows].sum())
        lengths = batch.attention_mask[rows].sum(-1).tolist()
        plans = self.micro_batcher.plan(lengths)
        plans += [[]] * (self._world_max(len(plans)) - len(plans))  # [] = a zero-weight pass
        opt.zero_grad()
        sums: dict[str, float] = defaultdict(float)
        for plan in plans:
            micro_rows = [rows[i] for i in plan] or [0]
            part = trim(batch, micro_rows, pad_to_batch=self.micro_batcher.pads_to_batch)
            picked = inputs.rows(micro_rows, part.input_ids.shape[1])
            loss, metrics = self._micro_loss(objective, divisors, part, picked)
            self.manual_backward(loss if plan else loss * 0.0)
            share = float(part.response_mask.sum()) / max(total_tokens, 1.0) if plan else 0.0
            for k, v in metrics.items():
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
        # the update runs in one autocast region, whose cache keeps a bf16 copy of each weight: the step changed
        # the weights in place, so the next forward (a step, the update-KL guard) must cast them again
        torch.clear_autocast_cache()
        return dict(sums)

    def _micro_loss(
        self, objective: Objective, divisors: Divisors, part: RolloutBatch, inputs: UpdateInputs
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One micro-batch's share of the objective."""
        mask = part.response_mask
        old_logp = inputs.old_logp
        with_entropy = objective.entropy_coef > 0
        logp, entropy = policy_forward(self.actor, part, self.algorithm.temperature, with_entropy=with_entropy)
        # the first step still has the sampling weights
        gap = masked_mean((logp.detach() - old_logp).abs(), mask) if inputs.measure_gap else None
        measured: dict[str, torch.Tensor] = {}
        if inputs.old_from_forward:
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
        """The reference's log-probs; with LoRA, the actor's with its adapters off."""
        if self.reference is not None:
            return self._no_grad_logprobs(self.reference, batch)
        with self.actor.disable_adapter():
            return self._no_grad_logprobs(self.actor, batch)

    def _no_grad_values(self, batch: RolloutBatch) -> torch.Tensor:
        return self._no_grad_pass(batch, self.critic)

    def _no_grad_pass(self, batch: RolloutBatch, per_token: Any) -> torch.Tensor:
        """``per_token(part)`` over unpadded micro-batches, as ``[B, L]``."""
        out = torch.zeros_like(batch.behaviour_logprobs)
        lengths = batch.attention_mask.sum(-1).tolist()
        plans = self.algorithm.token_budget.plan(lengths)
        plans += [[]] * (self._world_max(len(plans)) - len(plans))
        for plan in plans:
            values = per_token(trim(batch, plan or [0], pad_to_batch=False))
            if plan:  # an empty plan only joins the other ranks
                out[plan, : values.shape[1]] = values
        return out * batch.response_mask

    def validation_step(self, dataloader_iter: Iterator[Any]) -> None:
        """Held-out episodes as ``eval/*``, played here, after `on_validation_start` caught the engine up."""
        batch, _, _ = next(dataloader_iter)
        self._record_held_out(batch)
        metrics = eval_metrics(batch)
        for key, value in metrics.items():
            self.log(key, value, batch_size=len(batch.episode_metrics), sync_dist=True)
        self.log("step", float(self.steps_done), batch_size=len(batch.episode_metrics), sync_dist=True)
        if "eval/success_rate" in metrics and self.trainer.state.fn == "fit":
            self._report_eval(self._reduced(metrics))
        elif "eval/success_rate" in metrics and self.trainer.state.fn == "validate":
            from lightning.pytorch.utilities import rank_zero_info

            episodes = len(batch.episode_metrics) * self.trainer.world_size
            report = EvalReport.of(self.steps_done, self._reduced(metrics), 0.0, None, episodes)
            rank_zero_info(report.validate_line())
            rollout = rollout_of(self.trainer)
            for episode in batch.episodes[: rollout.evaluation.show_episodes if rollout is not None else 0]:
                rank_zero_info("\n".join(episode_lines(episode, batch.traj_id.count(episode.traj_key))))

    def on_validation_start(self) -> None:
        self._catch_up()

    def on_train_start(self) -> None:
        """The engine catches up with a restored checkpoint; evaluate at step 0 if ``data.evaluation.at_fit_start``."""
        self._catch_up()
        self.fit_record.begin(self.steps_done)
        rollout = rollout_of(self.trainer)
        if rollout is None or not rollout.evaluation.at_fit_start or self.steps_done > 0:
            return
        batch = rollout.evaluate()
        self._record_held_out(batch)
        reduced = self._reduced(eval_metrics(batch))
        # Lightning flushes validation results only inside its loops
        for logger in self.loggers:
            logger.log_metrics(reduced, step=0)
        if "eval/success_rate" in reduced:
            self._report_eval(reduced)

    def _record_held_out(self, batch: RolloutBatch) -> None:
        """Every rank's episodes of this evaluation, for the run certificate (`callbacks.certificate`)."""
        by = self.trainer.state.fn.value if self.trainer.state.fn is not None else "fit"
        self.fit_record.held_out.append(gathered(held_out(batch, self.steps_done, self.global_step, by)))

    def _reduced(self, metrics: dict[str, float]) -> dict[str, float]:
        return {k: float(self.trainer.strategy.reduce(torch.tensor(v), reduce_op="mean")) for k, v in metrics.items()}

    def _report_eval(self, metrics: dict[str, float]) -> None:
        """Record a held-out evaluation; the progress display (``fit_record.evals_shown``) or the log shows it."""
        evals = self.fit_record.evals
        if evals and evals[-1].step == self.steps_done:
            return  # a `max_time` stop evaluates the same weights again
        minutes = (time.perf_counter() - self.fit_record.started) / 60
        first = evals[0] if evals else None
        report = EvalReport.of(self.steps_done, metrics, minutes, first)
        evals.append(report)
        if not self.fit_record.evals_shown:
            from lightning.pytorch.utilities import rank_zero_info

            rank_zero_info(report.line())

    @property
    def stopping(self) -> bool:
        return self.rollout_steps_limit is not None and self.steps_done >= self.rollout_steps_limit

    @property
    def policy_version(self) -> int:
        """Rollout batches trained on: the unit of staleness."""
        return self.steps_done

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rollout_steps"] = self.steps_done
        checkpoint["eval_reports"] = [report.to_dict() for report in self.fit_record.evals]
        if self.lora.enabled:  # for `training.lora.export_adapter`
            from roll_lightning.training.lora import trainable_keys

            keys = sorted(trainable_keys(self.actor, "actor."))
            checkpoint["lora"] = {"config": dataclasses.asdict(self.lora), "model": str(self.model_path), "keys": keys}

    @property
    def strict_loading(self) -> bool:
        """With LoRA, `training.lora.keep_only_adapters` checks loads."""
        return not self.lora.enabled

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.lora.enabled:  # FSDP2 full-file loads skip the lora load hook
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
    """``[B]``: a row's advantage, or its reply tokens' mean (GAE)."""
    if advantages.dim() == 1:
        return advantages.detach().float().cpu()
    mask = batch.response_mask.to(advantages.dtype)
    return ((advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)).detach().float().cpu()


def eval_metrics(batch: RolloutBatch) -> dict[str, float]:
    """An evaluation batch's headline metrics as ``eval/*``."""
    keys = ("success_rate", "return_mean", "turns_mean", "invalid_action_rate")
    out = {f"eval/{k}": float(batch.metrics[f"rollout/{k}"]) for k in keys if f"rollout/{k}" in batch.metrics}
    for key, value in batch.metrics.items():  # multi-env: rollout/<tag>/<name>
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "rollout" and parts[2] in keys:
            out[f"eval/{parts[1]}/{parts[2]}"] = float(value)
    if len(batch):
        out["eval/policy_version"] = float(batch.policy_version.min())
    return out


@dataclasses.dataclass(frozen=True)
class UpdateInputs:
    """The no-grad passes' outputs, named so no two swap places, and what the update's own forward is for."""

    old_logp: torch.Tensor  # the engine's or recomputed
    advantages: torch.Tensor
    ref_logp: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    policy_mask: torch.Tensor | None = None
    old_from_forward: bool = False  # the forward, detached, is the old policy (one step per batch)
    measure_gap: bool = False  # the first step: the forward still has the sampling weights

    def rows(self, rows: list[int], width: int) -> UpdateInputs:
        """These rows' tensors, cut to ``width`` tokens."""

        def pick(x: Any) -> Any:
            if not isinstance(x, torch.Tensor):
                return x
            x = x[rows]
            return x[:, :width] if x.dim() == 2 else x

        return UpdateInputs(**{f.name: pick(getattr(self, f.name)) for f in dataclasses.fields(self)})


def _silent_rows(advantages: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    """Rows whose every reply token has advantage 0."""
    return (_tokens(advantages, batch) * batch.response_mask).abs().sum(-1) == 0


def _tokens(x: torch.Tensor, batch: RolloutBatch) -> torch.Tensor:
    return x[:, None].expand_as(batch.behaviour_logprobs) if x.dim() == 1 else x


def max_time_timer(trainer: L.Trainer) -> Any:
    """The `Timer` callback that enforces ``trainer.max_time``, or None without one."""
    from lightning.pytorch.callbacks import Timer

    return next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)


def run_time_fraction(trainer: L.Trainer) -> float | None:
    """How much of ``trainer.max_time`` the fit has used (resumes included), or None without one."""
    timer = max_time_timer(trainer)
    if timer is None or (left := timer.time_remaining("train")) is None:
        return None
    elapsed = timer.time_elapsed("train")
    return min(1.0, elapsed / max(elapsed + left, 1e-9))


def _unwrapped(opt: Any) -> torch.optim.Optimizer:
    """The torch optimiser under Lightning's wrapper."""
    return getattr(opt, "optimizer", opt)
