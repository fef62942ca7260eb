"""Rollout: generation engines (imported only when built), episodes, the scheduler and the `RolloutDataModule`."""

from roll_lightning._compat import check_torch_companions

check_torch_companions()  # before torch is imported: a clear message, not a deep traceback

from roll_lightning.rollout.config.rollout import RolloutConfig, RolloutConfigError  # noqa: E402
from roll_lightning.rollout.episodes.batch import RolloutBatch, collate  # noqa: E402
from roll_lightning.rollout.episodes.episode import ContextBudgetError, Episode, EpisodeSettings, Turn  # noqa: E402
from roll_lightning.rollout.prompts.chat import PromptConfig, TemplateDriftError  # noqa: E402
from roll_lightning.rollout.scheduling.ledger import group_seed  # noqa: E402
from roll_lightning.rollout.scheduling.scheduler import RolloutScheduler  # noqa: E402

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
