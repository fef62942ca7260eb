"""The warnings and notices that do not apply to this design, silenced one by one (never wholesale), each
with why it does not apply.
"""

from __future__ import annotations

import logging
import re
import warnings

from lightning.fabric.utilities.warnings import PossibleUserWarning

# (category, message regex, why it does not apply)
KNOWN_WARNINGS: list[tuple[type[Warning], str, str]] = [
    (
        PossibleUserWarning,
        r"You are using the `dataloader_iter` step flavor",
        "each step pulls exactly one rollout batch from the iterator (AgentRLModule.training_step), so batch_idx "
        "stays right; there is no gradient accumulation across batches",
    ),
    (
        UserWarning,
        r"Found `dataloader_iter` argument in the `(training|validation)_step`",
        "the rollout happens inside the step on purpose (timing, the engine's sleep between rollout and update)",
    ),
    (
        FutureWarning,
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        "Lightning 2.6's own pytree helper on torch >= 2.10; not our code, nothing for a user to change",
    ),
]

# Lightning's info lines (logging, not warnings) that advertise services rather than describe the run.
KNOWN_NOTICES: list[str] = [r"^💡 Tip: "]

# vLLM's warnings that describe what the engine does on purpose: (message regex, why it does not apply)
KNOWN_VLLM_NOTICES: list[tuple[str, str]] = [
    (
        r"^Attempted to load weight \S+ with dtype torch\.float32 into parameter with dtype",
        "the engine runs in data.engine.dtype from the trainer's float32 weights; vLLM casts them (once per tensor "
        "at start-up: a line per tensor)",
    ),
    (
        r"^(RotaryEmbedding|ParallelLMHead): Failed to load weights$",
        "at every weight sync: rotary embeddings have no weights, and a tied output head is the embedding, repacked "
        "after the load (VLLMEngine._reload)",
    ),
]


class _DropNotices(logging.Filter):
    def __init__(self, patterns: list[str] | None = None) -> None:
        super().__init__()
        self.patterns = KNOWN_NOTICES if patterns is None else patterns

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(re.search(pattern, message) for pattern in self.patterns)


def silence_vllm_notices() -> None:
    """Drop `KNOWN_VLLM_NOTICES` from vLLM's handlers (vLLM sets its logging up when imported)."""
    patterns = [pattern for pattern, _why in KNOWN_VLLM_NOTICES]
    for handler in logging.getLogger("vllm").handlers:
        if not any(isinstance(f, _DropNotices) and f.patterns == patterns for f in handler.filters):
            handler.addFilter(_DropNotices(patterns))


def silence_known_noise() -> None:
    """Install the filters for this process, before anything is built."""
    for category, pattern, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    lightning_log = logging.getLogger("lightning.pytorch")
    if not any(isinstance(f, _DropNotices) for f in lightning_log.filters):
        for handler in lightning_log.handlers:
            handler.addFilter(_DropNotices())
        lightning_log.addFilter(_DropNotices())
    # transformers' "Loading weights" bars turn to noise in a log file
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
