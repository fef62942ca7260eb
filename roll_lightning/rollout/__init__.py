"""Rollout: generation engines, the episode runner, groups, the scheduler and the `RolloutDataModule`.

The engine-free parts (config, batch rows, scheduler) import torch but not transformers or vLLM; engines are
imported from `roll_lightning.rollout.engines` when built.
"""

from roll_lightning._compat import check_torch_companions

check_torch_companions()  # before torch/transformers are imported: a clear message instead of a deep one

from roll_lightning.rollout.batch import RolloutBatch, collate  # noqa: E402
from roll_lightning.rollout.chat import PromptConfig, TemplateDriftError  # noqa: E402
from roll_lightning.rollout.config import RolloutConfig, RolloutConfigError  # noqa: E402
from roll_lightning.rollout.episode import ContextBudgetError, Episode, EpisodeSettings, Turn  # noqa: E402
from roll_lightning.rollout.ledger import group_seed  # noqa: E402
from roll_lightning.rollout.scheduler import RolloutScheduler  # noqa: E402

__all__ = [
    "ContextBudgetError",
    "Episode",
    "EpisodeSettings",
    "PromptConfig",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutConfigError",
    "RolloutScheduler",
    "TemplateDriftError",
    "Turn",
    "collate",
    "group_seed",
]
