"""A rollout batch built by hand from a chat model, for training checks that need known advantages.

Every group has the same token counts, so any split by group gives equal shares (the 1- vs 2-rank comparison
relies on it). Behaviour log-probs are the model's own, teacher-forced at temperature 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch

from roll_lightning.rollout.episodes.batch import RolloutBatch, collate
from roll_lightning.rollout.episodes.episode import Episode, Turn
from roll_lightning.rollout.prompts.chat import TokenHistory

GOOD, BAD = "<answer>Left</answer>", "<answer>Right</answer>"


def handmade_batch(
    model_dir: Path, tokenizer: Any, groups: int = 2, layout: str = "trajectory", turns: int = 1
) -> RolloutBatch:
    """``groups`` boards, four members each (GOOD, BAD, GOOD, BAD replies on every turn, reward 1 for GOOD at the
    end); ``turns`` > 1 makes each episode one growing conversation, as the rollout's trajectory rows are."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = tokenizer.eos_token_id
    episodes = []
    for g in range(groups):
        for member, reply in enumerate([GOOD, BAD, GOOD, BAD]):
            history = TokenHistory(tokenizer)  # the rollout's own growing conversation
            episode = Episode(group_index=g, member=member, seed=100 + g, env_id="handmade", turns=[])
            for k in range(turns):
                prompt = list(history.add_user(f"Turn {k + 1}:\n#####\n#P_O#\n#####\nboard {g}"))
                response = tokenizer.encode(reply, add_special_tokens=False) + [eos]
                history.add_reply(response, {eos})
                with torch.no_grad():
                    logits = model(torch.tensor([history.ids])).logits[0, -len(response) - 1 : -1]
                logp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
                turn = Turn(prompt, response, logp.tolist(), "stop", 0, observation=f"board {g}", reply=reply)
                turn.reward = 1.0 if reply == GOOD and k == turns - 1 else 0.0
                episode.turns.append(turn)
            episodes.append(episode)
    return collate(episodes, layout, tokenizer.pad_token_id)


def reply_logprob(model: torch.nn.Module, batch: RolloutBatch, row: int) -> float:
    """Sum of the log-probs of row ``row``'s reply tokens under ``model``."""
    ids = batch.input_ids[row : row + 1]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=batch.attention_mask[row : row + 1]).logits
    logp = torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return float(logp[batch.response_mask[row, 1:]].sum())


class Repeat(torch.utils.data.IterableDataset):
    def __init__(self, batch: RolloutBatch) -> None:
        self.batch = batch

    def __iter__(self) -> Iterator[RolloutBatch]:
        while True:
            yield self.batch


class FixedBatches(L.LightningDataModule):
    """The same rollout batch every step, for checks where the rollout is not under test."""

    def __init__(self, batch: RolloutBatch) -> None:
        super().__init__()
        self.batch = batch

    def train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(Repeat(self.batch), batch_size=None)
