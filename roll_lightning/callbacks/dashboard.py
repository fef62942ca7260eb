"""`HeadlineDashboard`: TensorBoard's Custom Scalars page opens on what a run is for (success, return, time),
rather than the Scalars page's alphabetical list that starts with ``env/``. Multiline charts take regexes.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

LAYOUT: dict[str, dict[str, list[object]]] = {
    "headline": {
        "success rate (training episodes, held-out)": ["Multiline", ["rollout/success_rate", "eval/success_rate"]],
        "return (training episodes, held-out)": ["Multiline", ["rollout/return_mean", "eval/return_mean"]],
        "invalid replies": ["Multiline", ["rollout/invalid_action_rate", "eval/invalid_action_rate"]],
    },
    "time per rollout step (s)": {
        "split": ["Multiline", ["timing/step_s", "timing/rollout_s", "timing/train_s", "sync/total_s"]],
    },
}


PER_ENV: dict[str, list[object]] = {
    "success rate per env (training episodes, held-out)": ["Multiline", [r"(rollout|eval)/[^/]+/success_rate"]],
    "return per env (training episodes, held-out)": ["Multiline", [r"(rollout|eval)/[^/]+/return_mean"]],
}


def layout(several_envs: bool) -> dict[str, dict[str, list[object]]]:
    return {**LAYOUT, "per env": PER_ENV} if several_envs else LAYOUT


class HeadlineDashboard(L.Callback):
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from roll_lightning.rollout.datamodule import RolloutDataModule

        if trainer.global_rank != 0:
            return
        data = getattr(trainer, "datamodule", None)
        several = isinstance(data, RolloutDataModule) and (data.rollout.tagged or bool(data.evaluation.envs))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(layout(several))
