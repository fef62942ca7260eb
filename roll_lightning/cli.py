"""`python -m roll_lightning fit --config configs/sokoban.yaml`: LightningCLI over `AgentRLModule` and
`RolloutDataModule`, with OmegaConf interpolation (``${...}``) in configs and overrides.

Shared values are linked, not repeated: the data module generates with the model the module trains
(``model.model`` → ``data.model``) and the trainer's log-probs use the sampling temperature
(``data.rollout.episode.sampling.temperature`` → ``model.algorithm.temperature``). Settings that cannot work
together fail here, before any server or model starts, naming the key.

SIGTERM stops a run soon (the rollout in flight is abandoned, see `roll_lightning.rollout.datamodule`) and exits
with status 143, like a process the signal killed, so a job scheduler sees that the run did not finish; the last
checkpoint is the last completed step, and ``--ckpt_path last`` carries on from it.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from roll_lightning.module import AgentRLModule
from roll_lightning.rollout.datamodule import RolloutDataModule


class RollLightningCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model", "data.model")
        parser.link_arguments("data.rollout.episode.sampling.temperature", "model.algorithm.temperature")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        from roll_lightning.models import resolve_model

        path = resolve_model(config.model.model)
        config.model.model = config.data.model = str(path)

    def after_instantiate_classes(self) -> None:
        model, data = self.model, self.datamodule
        data.rollout.check_estimator(model.algorithm.estimator)
        if model.algorithm.estimator == "gigpo" and data.rollout.episode.layout != "step":
            raise ValueError("model.algorithm.estimator=gigpo needs data.rollout.episode.layout: step")


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    try:
        RollLightningCLI(
            AgentRLModule,
            RolloutDataModule,
            args=args,
            parser_kwargs={"parser_mode": "omegaconf+"},
            save_config_kwargs={"overwrite": True},
            seed_everything_default=0,
            trainer_defaults=_trainer_defaults(),
        )
    except SIGTERMException:  # Lightning's own exit code would be 0, as if the run had finished
        print("roll_lightning: stopped by SIGTERM; resume with --ckpt_path last", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)


def _trainer_defaults() -> dict[str, Any]:
    from lightning.pytorch.callbacks import ModelCheckpoint

    # A checkpoint after every rollout step (`last.ckpt`), so `fit --ckpt_path last` after a kill loses at most
    # the step in flight; the optimiser-step count is a multiple of rollout steps, so "every 1" is every step.
    checkpoint = ModelCheckpoint(save_last=True, every_n_train_steps=1, save_top_k=1)
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
