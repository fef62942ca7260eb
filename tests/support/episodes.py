"""Hand-made episodes for the trajectory dump and viewer tests: three groups of two (sokoban, frozenlake,
sokoban) with markup in every reply, so escaping shows."""

from __future__ import annotations

from typing import Any

from roll_lightning.rollout.episode import Episode, Turn

SOKOBAN = "#####\n#P_O#\n#_X_#\n#####"
FROZEN = "P_O\n___\n__G"
XSS = "<script>alert(1)</script><answer>Left</answer>"


def prompt_text(tokenizer: Any, observation: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Turn 1:\n{observation}"}], tokenize=False, add_generation_prompt=True
    )


def make_episodes(tokenizer: Any, step: int) -> list[Episode]:
    """Three groups of two (sokoban, frozenlake, sokoban); seeds encode the step, so a dump of a stale batch
    would show. Member 0 of each group plays two turns and succeeds; member 1 plays one invalid turn."""
    episodes = []
    for g, (env_id, board) in enumerate([("sokoban", SOKOBAN), ("frozenlake", FROZEN), ("sokoban", SOKOBAN)]):
        prompt = tokenizer.encode(prompt_text(tokenizer, board), add_special_tokens=False)
        for member in range(2):
            reply_ids = tokenizer.encode(XSS, add_special_tokens=False) + [tokenizer.eos_token_id]
            first = Turn(prompt, reply_ids, [-0.5] * len(reply_ids), "stop", step, observation=board, reply=XSS)
            if member == 0:
                first.reward, first.metrics = 0.5, {"success": 0.0, "nan_metric": float("nan")}
                second = Turn([5, 6], [7, 8, 9], [-0.1] * 3, "length", step + 1, observation=board + "\nmoved")
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
