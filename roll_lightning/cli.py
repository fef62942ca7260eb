"""`python -m roll_lightning fit --config configs/sokoban.yaml`: LightningCLI over `AgentRLModule` and
`RolloutDataModule`, with OmegaConf interpolation (``${...}``) in configs and overrides.

Shared values are linked, not repeated: the data module generates with the model the module trains
(``model.model`` → ``data.model``) and the trainer's log-probs use the sampling temperature
(``data.rollout.episode.sampling.temperature`` → ``model.algorithm.temperature``). Settings that cannot work
together fail here, before any server or model starts, naming the key.

SIGTERM stops a run soon (the rollout in flight is abandoned, see `roll_lightning.rollout.datamodule`) and exits
with status 143, like a process the signal killed, so a job scheduler sees that the run did not finish; SIGINT
(Ctrl-C) does the same and exits with 130. The last checkpoint is the last completed step, and ``--ckpt_path
last`` carries on from it. Bad input prints one line, ``roll_lightning: error: ...``, and exits with 2
(``ROLL_DEBUG=1`` shows the traceback); ``--key -1e-4`` is read as ``--key=-1e-4``. See `roll_lightning.exits`.
"""

from __future__ import annotations

import os
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from roll_lightning.exits import run_cli
from roll_lightning.module import AgentRLModule
from roll_lightning.rollout.datamodule import RolloutDataModule


class RollLightningCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model", "data.model")
        parser.link_arguments("data.rollout.episode.sampling.temperature", "model.algorithm.temperature")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        from roll_lightning.models import resolve_model
        from roll_lightning.training.config import check_sampling_temperature

        # named here, under the key the user sets: the module only sees the linked copy, model.algorithm.temperature
        check_sampling_temperature(config.data.rollout.episode.sampling.temperature)
        path = resolve_model(config.model.model)
        config.model.model = config.data.model = str(path)

    def after_instantiate_classes(self) -> None:
        model, data = self.model, self.datamodule
        data.rollout.check_estimator(model.algorithm.estimator)
        if model.algorithm.estimator == "gigpo" and data.rollout.episode.layout != "step":
            raise ValueError("model.algorithm.estimator=gigpo needs data.rollout.episode.layout: step")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        from roll_lightning.checkpoints import use_checksummed_io

        return use_checksummed_io(super().instantiate_trainer(**kwargs))  # atomic, checksummed, verified on load

    def before_fit(self) -> None:
        self._resolve_ckpt_path(fitting=True)

    def before_validate(self) -> None:
        self._resolve_ckpt_path(fitting=False)

    def _resolve_ckpt_path(self, fitting: bool) -> None:
        """``--ckpt_path last`` is the run's own `last.ckpt`, and any checkpoint is verified before work starts."""
        from roll_lightning.checkpoints import resolve_ckpt_path

        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_ckpt_path(config.get("ckpt_path"), self.trainer, fitting)


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    run_cli(_run, args)  # one line per input error, exit 130/143 on SIGINT/SIGTERM (see roll_lightning.exits)


def _run(args: list[str] | None) -> None:
    RollLightningCLI(
        AgentRLModule,
        RolloutDataModule,
        args=args,
        # exit_on_error=False: the parser raises its errors, and `run_cli` prints each as one line (no usage dump)
        parser_kwargs={"parser_mode": "omegaconf+", "exit_on_error": False},
        save_config_kwargs={"overwrite": True},
        seed_everything_default=0,
        trainer_defaults=_trainer_defaults(),
    )


def _trainer_defaults() -> dict[str, Any]:
    from roll_lightning.checkpoints import StepCheckpoint

    # `<default_root_dir>/checkpoints/last.ckpt` after every rollout step, whatever the logger, so `fit --ckpt_path
    # last` after a kill loses at most the step in flight (see roll_lightning.checkpoints)
    checkpoint = StepCheckpoint()
    return {
        "callbacks": [checkpoint],
        "max_steps": -1,  # the run's length is model.rollout_steps (Lightning counts optimiser steps)
        "max_epochs": -1,  # the rollout stream is endless: epochs mean nothing here
        "accelerator": "auto",
        "devices": 1,
        "log_every_n_steps": 1,
        # evaluation episodes are whole rollouts: run them when asked (val_check_interval), not as a sanity check
        "num_sanity_val_steps": 0,
        "enable_checkpointing": True,
    }
