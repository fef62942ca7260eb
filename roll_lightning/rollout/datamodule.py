"""`RolloutDataModule`: the rollout as a Lightning DataModule, on its own asyncio loop thread (`loop.RolloutLoop`;
hence ``num_workers=0``).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine, Iterator
from dataclasses import replace
from typing import Any, Literal, TypeVar

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.utils.data import DataLoader, IterableDataset

from roll_lightning.env_client import EnvOutage
from roll_lightning.env_client.errors import EpisodesKeepFailing
from roll_lightning.rollout.config.envs import LaneSpec
from roll_lightning.rollout.config.rollout import EnvsConfig, EvalConfig, RolloutConfig, RolloutConfigError
from roll_lightning.rollout.engines.base import GenerationEngine
from roll_lightning.rollout.engines.config import EngineConfig
from roll_lightning.rollout.engines.factory import build_engine
from roll_lightning.rollout.engines.placement import TRAIN
from roll_lightning.rollout.episodes.batch import RolloutBatch
from roll_lightning.rollout.handover import Handover
from roll_lightning.rollout.prompts.vision import ImageEncoder
from roll_lightning.rollout.runtime.loop import RolloutLoop
from roll_lightning.rollout.runtime.servers import EnvServers
from roll_lightning.rollout.runtime.world_stop import (
    FAILED,
    GO,
    STOPPING,
    PeerRankFailed,
    WorldStop,
    quiet_lightning_notifier,
)
from roll_lightning.rollout.scheduling.elastic import ElasticResume, repartition
from roll_lightning.rollout.scheduling.metrics import fault_totals
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler

__all__ = ["EnvsConfig", "EvalConfig", "RolloutDataModule"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class RolloutDataModule(L.LightningDataModule):
    def __init__(
        self,
        model: str,
        rollout: RolloutConfig = RolloutConfig(),
        envs: EnvsConfig = EnvsConfig(),
        engine: EngineConfig = EngineConfig(),
        colocate: bool | Literal["partial"] = True,
        evaluation: EvalConfig = EvalConfig(),
    ) -> None:
        """
        Args:
            model: local model folder (engine and tokenizer).
            rollout: how episodes are collected.
            envs: where the env servers are.
            engine: the generation engine.
            colocate: true: the engine sleeps during updates; false: it keeps generating (within
                rollout.max_staleness); ``partial``: only its ``train`` replicas step aside.
            evaluation: held-out evaluation episodes.
        """
        super().__init__()
        self.model = model
        if colocate == "partial":
            check_partial(engine)
        elif not isinstance(colocate, bool):
            raise RolloutConfigError(f"data.colocate must be true, false or partial, got {colocate!r}")
        self.colocate = colocate
        self.evaluation = evaluation
        self.rollout = rollout
        self.envs = envs
        self.engine_config = engine
        evaluation.rollout(rollout)  # fails now on a bad evaluation list
        self.engine: GenerationEngine | None = None
        self.scheduler: RolloutScheduler | None = None
        self.handover: Handover | None = None  # the training side's turns with the engine, once set up
        self.tokenizer: Any = None
        self.vision: ImageEncoder | None = None  # None: a text-only model
        self.servers: EnvServers | None = None
        self.loop: RolloutLoop | None = None
        self._pending_state: dict[str, Any] | None = None
        self._untrained_state: dict[str, Any] | None = None  # the position before a batch that was never trained on
        # the run's stop came out of a rollout, between steps, on every rank at once: all may join a last checkpoint
        self.stopped_together = False
        self._watch: asyncio.Task[None] | None = None  # `WorldStop.watch`, with several ranks
        self.elastic: ElasticResume | None = None  # set when this run resumed one saved on another number of ranks

    # -- lifecycle -----------------------------------------------------------------------------------

    def setup(self, stage: str) -> None:
        if self.scheduler is not None:
            return
        from transformers import AutoTokenizer

        rank, world = self._rank_world()
        self._untrained_state, self.stopped_together = None, False
        self.tokenizer = AutoTokenizer.from_pretrained(self.model)
        self.vision = ImageEncoder.load(self.model, self.tokenizer)
        self.loop = RolloutLoop(f"rollout-loop-rank{rank}")
        if world > 1 and torch.distributed.is_initialized():
            self.loop.world_stop = WorldStop(self.trainer.strategy.root_device)
            quiet_lightning_notifier(self.trainer)
        try:
            self.call(self._start(rank, world))
        except BaseException:
            self.teardown(stage)
            raise

    async def _start(self, rank: int, world: int) -> None:
        self.servers = EnvServers(self.envs, [*self.rollout.lanes, *self.eval_lanes()])
        await self.servers.start(self.tokenizer, self.vision)  # checks env ids, configs, endpoints, budgets
        placement: dict[str, Any] = {}  # no trainer: the defaults
        if self._has_trainer():
            trainer = self.trainer
            placement = {
                "train_device": str(trainer.strategy.root_device),
                "local_rank": trainer.local_rank,
                "local_world_size": trainer.num_devices,
            }
        # off the loop: health checks go on meanwhile
        self.engine = await asyncio.to_thread(build_engine, self.engine_config, self.model, **placement)
        pools = self.servers.pools_for(self.rollout.lanes)
        self.scheduler = RolloutScheduler(
            pools, self.engine, self.tokenizer, self.rollout, rank=rank, world_size=world, vision=self.vision
        )
        self.handover = Handover(self.engine, self.scheduler, self.call, self.colocate)
        if self._pending_state is not None:
            self.scheduler.load_state_dict(self._pending_state)
        if self.loop is not None and self.loop.world_stop is not None:
            self._watch = asyncio.create_task(self.loop.world_stop.watch(self.loop))

    @property
    def eval_rollout(self) -> RolloutConfig:
        """The evaluation as a rollout config (groups of one)."""
        return self.evaluation.rollout(self.rollout)

    def eval_lanes(self) -> list[LaneSpec]:
        """The held-out envs, each named by its config key."""
        lanes = self.eval_rollout.lanes
        if self.evaluation.envs:
            return [replace(lane, key=f"data.evaluation.envs[{i}]") for i, lane in enumerate(lanes)]
        return [replace(lane, key=train.key) for lane, train in zip(lanes, self.rollout.lanes, strict=True)]

    def on_exception(self, exception: BaseException) -> None:
        """Lightning skips `teardown` when a run fails: tear down anyway."""
        self.teardown("exception")

    def teardown(self, stage: str) -> None:
        if self.loop is None:
            return
        try:
            self.call(self._stop(), timeout=120)
        except Exception:  # must finish even after a failed run
            log.exception("rollout teardown")
        self.loop.close()
        self.loop = None
        self.scheduler = self.engine = self.servers = self.handover = None

    async def _stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self.scheduler is not None:  # a checkpoint saved after fit still has it
            untrained = self._untrained_state
            self._pending_state = untrained if untrained is not None else self.scheduler.state_dict()
            await self.scheduler.close()
        if self.engine is not None:
            await self.engine.close()
        if self.servers is not None:
            await self.servers.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, interruptible: bool = False) -> T:
        """Run ``coro`` on the rollout loop and wait (`RolloutLoop.call`)."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("the rollout is not set up (call setup() first)")
        return self.loop.call(coro, timeout, interruptible)

    # -- data ----------------------------------------------------------------------------------------

    def next_batch(self) -> RolloutBatch:
        """Block until the next batch of complete groups is ready."""
        if self.scheduler is None:
            raise RuntimeError("the rollout is not set up (call setup() first)")
        # a batch that is never trained on (a stop, a failure, or another rank's, after its groups settled) must be
        # played again on resume: a checkpoint saved after it failed holds the position from before it
        before = self.scheduler.state_dict()
        try:
            return self._every_rank_or_none(self.scheduler.get_batch())
        except BaseException as err:
            self._untrained_state = before
            if isinstance(err, (EnvOutage, EpisodesKeepFailing)):
                self._log_fault_totals()  # the run ends: log its fault counts first
            raise

    def _every_rank_or_none(self, rollout: Coroutine[Any, Any, T]) -> T:
        """Run a rollout; with several ranks, all raise here at the same step if any is stopping or failed."""
        assert self.loop is not None
        stop = self.loop.world_stop
        try:
            batch = self.call(rollout, interruptible=True)
        except SIGTERMException:
            if stop is not None:
                stop.agree(STOPPING)
            self.stopped_together = True
            raise
        except BaseException:
            if stop is not None:
                stop.agree(FAILED)
            self.stopped_together = True
            raise
        if stop is not None and (verdict := stop.agree(GO)) != GO:
            self.stopped_together = True
            if verdict == FAILED:
                raise PeerRankFailed("another rank's rollout failed (its log says why); this rank stops with it")
            raise SIGTERMException(128 + (self.loop.terminating or signal.SIGTERM))
        return batch

    def _log_fault_totals(self) -> None:
        if self.scheduler is None or not self._has_trainer():
            return
        totals = fault_totals(self.scheduler)
        for logger in self.trainer.loggers:
            try:
                logger.log_metrics(totals, step=self.trainer.global_step)
                logger.save()
            except Exception:  # a logger that cannot write must not hide the env failure
                log.exception("logging the fault totals")

    def train_dataloader(self) -> DataLoader[RolloutBatch]:
        return DataLoader(_RolloutStream(self), batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader[RolloutBatch] | list[Any]:
        fitting = self._has_trainer() and self.trainer.state.fn == "fit"
        if fitting and not self.evaluation.during_fit:
            return []  # no validation loop in fit
        return DataLoader(_EvalOnce(self), batch_size=None, num_workers=0)

    def evaluate(self) -> RolloutBatch:
        """Play the held-out episodes (the same starts every time)."""
        if self.servers is None or self.engine is None:
            raise RuntimeError("the rollout is not set up (call setup() first)")
        rank, world = self._rank_world()
        config = self.eval_rollout
        pools = self.servers.pools_for(config.lanes)

        async def play() -> RolloutBatch:
            scheduler = RolloutScheduler(
                pools,
                self.engine,
                self.tokenizer,
                config,
                rank=rank,
                world_size=world,
                split="eval",
                vision=self.vision,
            )
            try:
                return await scheduler.get_batch()
            finally:
                await scheduler.close()

        return self._every_rank_or_none(play())

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch.to(device) if isinstance(batch, RolloutBatch) else batch

    # -- checkpoints ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position in its group sequence."""
        if self._untrained_state is not None:
            state = self._untrained_state
        elif self.scheduler is not None:
            state = self.scheduler.state_dict()
        elif self._pending_state is not None:
            state = self._pending_state
        else:
            return {}
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            states: list[Any] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(states, state)
        else:
            states = [state]
        return {"ranks": states}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        states = state_dict.get("ranks", [])
        if not states:
            return
        if self._has_trainer() and self.trainer.state.fn != "fit":
            return  # an evaluation plays its own held-out boards: the training position is not its business
        rank, world = self._rank_world()
        if len(states) != world:  # an elastic resume: the old ranks' groups dealt out to this run's
            states, self.elastic = repartition(states, world)
        self._pending_state = states[rank]
        if self.scheduler is not None:
            self.scheduler.load_state_dict(states[rank])

    def _rank_world(self) -> tuple[int, int]:
        return (self.trainer.global_rank, self.trainer.world_size) if self._has_trainer() else (0, 1)

    def _has_trainer(self) -> bool:
        try:
            return self.trainer is not None
        except RuntimeError:
            return False


class SetUpRollout(RolloutDataModule):
    """A `RolloutDataModule` after `setup` (for type checkers)."""

    engine: GenerationEngine
    scheduler: RolloutScheduler
    handover: Handover


def rollout_of(trainer: L.Trainer) -> SetUpRollout | None:
    """The run's set-up rollout, or None."""
    data = trainer.datamodule
    if isinstance(data, RolloutDataModule) and data.handover is not None:
        return data  # type: ignore[return-value]
    return None


def check_partial(engine: EngineConfig) -> None:
    """``data.colocate: partial`` needs replicas on the training device and elsewhere."""
    devices = engine.devices or []
    if TRAIN not in devices or all(entry == TRAIN for entry in devices):
        raise RolloutConfigError(
            "data.colocate: partial needs data.engine.devices to list the training device as 'train' and at least "
            f"one other device that keeps generating during updates, e.g. [train, cuda:1]; got {engine.devices}"
        )


class _RolloutStream(IterableDataset[RolloutBatch]):
    """An endless stream of rollout batches; an on-policy ``training_step`` must take ``dataloader_iter``, or
    Lightning fetches the next batch before this step's weights reach the engine."""

    def __init__(self, datamodule: RolloutDataModule) -> None:
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[RolloutBatch]:
        if self.datamodule.loop is not None:  # the trainer's steps begin: a signal lets the one running finish
            self.datamodule.loop.stop_between_steps = True
        while True:
            yield self.datamodule.next_batch()


class _EvalOnce(IterableDataset[RolloutBatch]):
    def __init__(self, datamodule: RolloutDataModule) -> None:
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[RolloutBatch]:
        yield self.datamodule.evaluate()
