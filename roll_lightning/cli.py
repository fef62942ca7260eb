"""`python -m roll_lightning fit --config configs/sokoban.yaml`: LightningCLI over `AgentRLModule` and
`RolloutDataModule`, with OmegaConf interpolation (``${...}``). Settings that cannot work together fail before
any server or model starts.
"""

from __future__ import annotations

import functools
import os
import random
import sys
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from roll_lightning.callbacks.certificate import RunCertificate
from roll_lightning.exits import CERTIFICATE_DIFFERS, close_process_group, run_cli
from roll_lightning.quiet import silence_known_noise
from roll_lightning.rollout.datamodule import RolloutDataModule
from roll_lightning.training.module import AgentRLModule


class RollLightningCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit`` and ``validate`` only: rollouts have no test or predict step."""
        subcommands = LightningCLI.subcommands()
        return {name: subcommands[name] for name in ("fit", "validate")}

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        if subcommand == "validate":
            parser.add_argument(
                "--certificate",
                type=str | None,
                default=None,
                help="A run's run.json (beside its checkpoints): replay its held-out evaluation of --ckpt_path's "
                "weights (none: the untrained model's) and say, item by item, what matches and what differs; "
                f"exit status {CERTIFICATE_DIFFERS} when anything differs (docs/reliability.md, 'Run certificate').",
            )
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("model.model", "data.model")
        parser.link_arguments("data.rollout.episode.sampling.temperature", "model.algorithm.temperature")
        from roll_lightning.training.config import engine_lora_rank

        parser.link_arguments(("model.lora.rank", "model.lora.sync"), "data.engine.max_lora_rank", engine_lora_rank)
        for key in ("model.seed", "data.rollout.seed", "data.engine.seed"):
            parser.link_arguments("seed_everything", key, run_seed)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        from roll_lightning.models import resolve_model
        from roll_lightning.training.config import check_sampling_temperature

        # here, under the key the user sets; the module sees only the linked copy
        check_sampling_temperature(config.data.rollout.episode.sampling.temperature)
        if config.data.engine.dtype is None:
            config.data.engine.dtype = config.model.dtype
        path = resolve_model(config.model.model)
        config.model.model = config.data.model = str(path)

    def after_instantiate_classes(self) -> None:
        from roll_lightning.training.estimate import check_rows

        rollout = self.datamodule.rollout  # before any server starts
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
            # a config's own ModelCheckpoint replaces it
            callbacks.append(StepCheckpoint())
        if config.get("enable_progress_bar") is not False:  # instead of Lightning's bar
            callbacks.append(RunProgress())
        kwargs["callbacks"] = callbacks
        return use_checksummed_io(super().instantiate_trainer(**kwargs))

    def before_fit(self) -> None:
        self._resolve_ckpt_path(fitting=True)
        if not self.datamodule.evaluation.during_fit:
            self.trainer.limit_val_batches = 0  # not an empty loop, which Lightning warns of

    def before_validate(self) -> None:
        self._resolve_ckpt_path(fitting=False)
        source = self.config_init["validate"].get("certificate")
        if source is not None:
            self.certificate().expect(source, self.config_init["validate"].get("ckpt_path"))

    def after_validate(self) -> None:
        lines = self.certificate().report_lines()
        if lines and self.trainer.is_global_zero:
            print("\n".join(lines), flush=True)

    def certificate(self) -> RunCertificate:
        """The run's `RunCertificate` (one of the trainer's default callbacks)."""
        return next(c for c in self.trainer.callbacks if isinstance(c, RunCertificate))

    @property
    def exit_status(self) -> int:
        """`CERTIFICATE_DIFFERS` after a ``validate --certificate`` that found a difference, else 0."""
        if self.subcommand != "validate" or self.config_init["validate"].get("certificate") is None:
            return 0
        if not self.trainer.is_global_zero:  # rank 0 compares
            return 0
        report = self.certificate().report
        if report is None:
            raise RuntimeError("validate --certificate: the evaluation ran, but nothing was compared")
        return 0 if report.matches else CERTIFICATE_DIFFERS

    def _resolve_ckpt_path(self, fitting: bool) -> None:
        """``--ckpt_path last`` is the run's own `last.ckpt`; any checkpoint is verified before work starts."""
        from roll_lightning.checkpoints import resolve_ckpt_path

        config = self.config_init[self.subcommand]
        config["ckpt_path"] = resolve_ckpt_path(config.get("ckpt_path"), self.trainer, fitting)


DESCRIPTION = (
    "Teach an LLM agent to act in multi-turn environments with RL. The main command: `python -m roll_lightning fit "
    "--config configs/sokoban.yaml` (learns Sokoban on a CPU in 30 minutes). Each configs/*.yaml says what it "
    "runs; `fit --help` lists every key, `--print_config` shows a run's full configuration."
)


@functools.lru_cache(maxsize=None, typed=True)  # typed: true is not 1
def run_seed(seed_everything: bool | int | None) -> int:
    """The seed of a run's parts: ``seed_everything``'s number, one random draw for ``true``, 0 for ``false``."""
    if seed_everything is True:
        return random.SystemRandom().randrange(2**31)
    return int(seed_everything or 0)


def main(args: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
    silence_known_noise()
    run_cli(_run, args)


def _run(args: list[str] | None) -> None:
    cli = RollLightningCLI(
        AgentRLModule,
        RolloutDataModule,
        args=args,
        # exit_on_error=False: `run_cli` prints each parser error as one line
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
        # model.optim builds the optimiser; Lightning's would miss the module's parameter groups
        auto_configure_optimizers=False,
        trainer_defaults=_trainer_defaults(),
    )
    close_process_group()
    if cli.exit_status:
        sys.exit(cli.exit_status)


def _trainer_defaults() -> dict[str, Any]:
    from roll_lightning.callbacks.dashboard import HeadlineDashboard
    from roll_lightning.callbacks.summary import RunSummary

    return {
        "callbacks": [RunSummary(), HeadlineDashboard(), RunCertificate()],
        "max_steps": -1,  # the run's length is model.rollout_steps (Lightning counts optimiser steps)
        "max_epochs": -1,  # the rollout stream is endless
        "accelerator": "auto",
        "devices": 1,
        "log_every_n_steps": 1,
        "num_sanity_val_steps": 0,  # evaluation episodes are whole rollouts
        "enable_checkpointing": True,
        "enable_model_summary": False,  # RunProgress's first line names the model
    }
