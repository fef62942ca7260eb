"""`python -m roll_lightning fit --config configs/sokoban.yaml`: LightningCLI over `AgentRLModule` and
`RolloutDataModule`, with OmegaConf interpolation (``${...}``) in configs and overrides.

Shared values are linked, not repeated: the data module generates with the model the module trains
(``model.model`` → ``data.model``) and the trainer's log-probs use the sampling temperature
(``data.rollout.episode.sampling.temperature`` → ``model.algorithm.temperature``), and the engine is built for
the policy's LoRA adapters (``model.lora.rank`` and ``sync`` → ``data.engine.max_lora_rank``). Settings that cannot work
together fail here, before any server or model starts, naming the key.

SIGTERM stops a run soon (the rollout in flight is abandoned, see `roll_lightning.rollout.datamodule`) and exits
with status 143, like a process the signal killed, so a job scheduler sees that the run did not finish; SIGINT
(Ctrl-C) does the same and exits with 130. The last checkpoint is the last completed step, and ``--ckpt_path
last`` carries on from it. Bad input prints one line, ``roll_lightning: error: ...``, and exits with 2
(``ROLL_DEBUG=1`` shows the traceback); ``--key -1e-4`` is read as ``--key=-1e-4``. See `roll_lightning.exits`.
"""

from __future__ import annotations

import functools
import os
import random
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from roll_lightning.exits import close_process_group, run_cli
from roll_lightning.quiet import silence_known_noise
from roll_lightning.rollout.datamodule import RolloutDataModule
from roll_lightning.training.module import AgentRLModule


class RollLightningCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit`` and ``validate`` only: there is no test or predict step for an agent's rollouts."""
        subcommands = LightningCLI.subcommands()
        return {name: subcommands[name] for name in ("fit", "validate")}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model", "data.model")
        parser.link_arguments("data.rollout.episode.sampling.temperature", "model.algorithm.temperature")
        from roll_lightning.training.config import engine_lora_rank

        # vLLM is built to serve the policy's adapters (model.lora.sync: adapters)
        parser.link_arguments(("model.lora.rank", "model.lora.sync"), "data.engine.max_lora_rank", engine_lora_rank)
        # one seed: the model's (LoRA init, mini-batch order), the boards' and the engine's sampling all follow it
        for key in ("model.seed", "data.rollout.seed", "data.engine.seed"):
            parser.link_arguments("seed_everything", key, run_seed)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        from roll_lightning.models import resolve_model
        from roll_lightning.training.config import check_sampling_temperature

        # named here, under the key the user sets: the module only sees the linked copy, model.algorithm.temperature
        check_sampling_temperature(config.data.rollout.episode.sampling.temperature)
        if config.data.engine.dtype is None:  # the engine generates in the trainer's dtype unless told otherwise
            config.data.engine.dtype = config.model.dtype
        path = resolve_model(config.model.model)
        config.model.model = config.data.model = str(path)

    def after_instantiate_classes(self) -> None:
        from roll_lightning.training.estimate import check_rows

        rollout = self.datamodule.rollout  # checked before any server starts (the module checks each batch too)
        check_rows(self.model.estimator, rollout.episode.row_layout, rollout.group_size)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        from lightning.pytorch.callbacks import ModelCheckpoint

        from roll_lightning.callbacks.progress import RunProgress
        from roll_lightning.checkpoints import StepCheckpoint, use_checksummed_io

        config = self._get(self.config_init, "trainer", default={})
        given = config.get("callbacks") or []
        callbacks = list(given) if isinstance(given, list) else [given]
        checkpointing = config.get("enable_checkpointing") is not False
        if checkpointing and not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            # `last.ckpt` after every rollout step, so `fit --ckpt_path last` after a kill loses at most the step in
            # flight (see roll_lightning.checkpoints); a config's own StepCheckpoint (every_n_train_steps) replaces it
            callbacks.append(StepCheckpoint())
        if config.get("enable_progress_bar") is not False:  # our one-line progress instead of Lightning's bar
            callbacks.append(RunProgress())
        kwargs["callbacks"] = callbacks
        return use_checksummed_io(super().instantiate_trainer(**kwargs))  # atomic, checksummed, verified on load

    def before_fit(self) -> None:
        self._resolve_ckpt_path(fitting=True)
        if not self.datamodule.evaluation.during_fit:
            self.trainer.limit_val_batches = 0  # no validation loop at all (not an empty one that Lightning warns of)

    def before_validate(self) -> None:
        self._resolve_ckpt_path(fitting=False)

    def _resolve_ckpt_path(self, fitting: bool) -> None:
        """``--ckpt_path last`` is the run's own `last.ckpt`, and any checkpoint is verified before work starts."""
        from roll_lightning.checkpoints import resolve_ckpt_path

        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_ckpt_path(config.get("ckpt_path"), self.trainer, fitting)


DESCRIPTION = (
    "Teach an LLM agent to act in multi-turn environments with RL. The main command: `python -m roll_lightning fit "
    "--config configs/sokoban.yaml` (learns Sokoban on a CPU in 30 minutes). Each configs/*.yaml says what it "
    "runs; `fit --help` lists every key, `--print_config` shows a run's full configuration."
)


@functools.cache
def run_seed(seed_everything: bool | int | None) -> int:
    """The seed of a run's parts, from ``seed_everything``: its number; ``true`` (Lightning draws a random seed)
    draws one here too, once; ``false`` gives 0."""
    if seed_everything is True:
        return random.SystemRandom().randrange(2**31)
    return int(seed_everything or 0)


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    silence_known_noise()  # the warnings that do not apply here, one by one (see roll_lightning.quiet)
    run_cli(_run, args)  # one line per input error, exit 130/143 on SIGINT/SIGTERM (see roll_lightning.exits)


def _run(args: list[str] | None) -> None:
    RollLightningCLI(
        AgentRLModule,
        RolloutDataModule,
        args=args,
        # exit_on_error=False: the parser raises its errors, and `run_cli` prints each as one line (no usage dump)
        parser_kwargs={
            "parser_mode": "omegaconf+",
            "exit_on_error": False,
            "prog": "python -m roll_lightning",
            "description": DESCRIPTION,
            "fit": {"description": "Train: rollouts on the env servers, updates, weight sync, evaluations."},
            "validate": {"description": "Play the held-out evaluation episodes once (with --ckpt_path: its weights)."},
        },
        save_config_kwargs={"overwrite": True},
        seed_everything_default=0,
        # the optimiser is part of the algorithm (model.optim: AdamW + the schedule); Lightning's generic
        # --optimizer/--lr_scheduler would build one without the module's parameter groups
        auto_configure_optimizers=False,
        trainer_defaults=_trainer_defaults(),
    )
    close_process_group()


def _trainer_defaults() -> dict[str, Any]:
    from roll_lightning.callbacks.dashboard import HeadlineDashboard
    from roll_lightning.callbacks.summary import RunSummary

    return {
        # RunSummary: where everything went, how to resume; HeadlineDashboard: TensorBoard's headline charts (the
        # step checkpoint is added in `instantiate_trainer`, unless the config brings its own)
        "callbacks": [RunSummary(), HeadlineDashboard()],
        "max_steps": -1,  # the run's length is model.rollout_steps (Lightning counts optimiser steps)
        "max_epochs": -1,  # the rollout stream is endless: epochs mean nothing here
        "accelerator": "auto",
        "devices": 1,
        "log_every_n_steps": 1,
        # evaluation episodes are whole rollouts: run them when asked (val_check_interval), not as a sanity check
        "num_sanity_val_steps": 0,
        "enable_checkpointing": True,
        "enable_model_summary": False,  # a 12-line table of one module; RunProgress's first line names the model
    }
