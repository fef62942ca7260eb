"""Hand-made episodes for the trajectory dump and viewer tests: three groups of two (sokoban, frozenlake,
sokoban) with markup in every reply, so escaping shows; `make_pictured_episodes`: the same with a PNG per
observation."""

from __future__ import annotations

import io
from typing import Any

import torch

from roll_lightning.rollout.episodes.episode import Episode, Turn
from roll_lightning.rollout.prompts.vision import IMAGE_MARKER, PromptImage

SOKOBAN = "#####\n#P_O#\n#_X_#\n#####"
FROZEN = "P_O\n___\n__G"
XSS = "<script>alert(1)</script><answer>Left</answer>"


def prompt_text(tokenizer: Any, observation: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Turn 1:\n{observation}"}], tokenize=False, add_generation_prompt=True
    )


def make_episodes(tokenizer: Any, step: int) -> list[Episode]:
    """Three groups of two (sokoban, frozenlake, sokoban); seeds encode the step, so a dump of a stale batch
    would show. Member 0 of each group plays two turns and succeeds (its second reply continued across a weight
    sync: ``on_suspend: keep``); member 1 plays one invalid turn."""
    episodes = []
    for g, (env_id, board) in enumerate([("sokoban", SOKOBAN), ("frozenlake", FROZEN), ("sokoban", SOKOBAN)]):
        prompt = tokenizer.encode(prompt_text(tokenizer, board), add_special_tokens=False)
        for member in range(2):
            reply_ids = tokenizer.encode(XSS, add_special_tokens=False) + [tokenizer.eos_token_id]
            first = Turn(prompt, reply_ids, [-0.5] * len(reply_ids), "stop", step, observation=board, reply=XSS)
            if member == 0:
                first.reward, first.metrics = 0.5, {"success": 0.0, "nan_metric": float("nan")}
                second = Turn([5, 6], [7, 8, 9], [-0.1] * 3, "length", step, observation=board + "\nmoved")
                second.versions = ((0, step), (1, step + 1))  # a weight sync came after its first token (keep)
                second.reply, second.reward, second.metrics = "<answer>Right</answer>", 1.0, {"success": 1.0}
                second.reply_prefix = "<answer>"  # a prompt part: the viewer greys it
                turns, end, final = [first, second], "terminated", board + "\nsolved"
            else:
                first.reward, first.action_valid, first.metrics = -0.1, False, {"success": 0.0}
                turns, end, final = [first], "max_turns", board
            episodes.append(
                Episode(
                    group_index=g,
                    member=member,
                    seed=1000 * step + g,
                    env_id=env_id,
                    episode_id=f"e{step}-{g}-{member}",
                    turns=turns,
                    end_reason=end,  # type: ignore[arg-type]
                    final_observation=final,
                )
            )
    return episodes


def png(rgb: tuple[int, int, int], size: int = 2) -> bytes:
    """A real ``size`` x ``size`` PNG of one colour (a browser decodes it: the viewer test checks its width)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(out, format="PNG")
    return out.getvalue()


def picture(rgb: tuple[int, int, int]) -> PromptImage:
    """A `PromptImage` as an image env's turn carries it: the PNG bytes, and pixel values the dump must drop."""
    return PromptImage(png(rgb), "image/png", torch.zeros(1, 1), (1, 2, 2), 1, 0)


def make_pictured_episodes(tokenizer: Any, step: int) -> list[Episode]:
    """`make_episodes` as an image env (``render: both``) plays them: every observation is the board, a newline
    and ``<image>``, with one PNG whose red channel is ``10 * turn`` (the final board's: 250), so a test can tell
    which picture shows where."""
    episodes = make_episodes(tokenizer, step)
    for ep in episodes:
        for k, turn in enumerate(ep.turns):
            turn.observation = f"{turn.observation}\n{IMAGE_MARKER}"
            turn.observation_images = (picture((10 * k, 0, 0)),)
        ep.final_observation = f"{ep.final_observation}\n{IMAGE_MARKER}"
        ep.final_images = (picture((250, 0, 0)),)
    return episodes
