"""The docs' agent (`my_agent.py`) as a long-running program: started once, it plays every episode the trainer
hands it, many at a time (docs/agents.md, "Agents that live for many episodes")."""

import openai

from roll_lightning.agent_client import Handed, serve_episodes


async def play(episode: Handed) -> tuple[float, dict[str, float]]:
    task = episode.task  # {"seed": ..., "group": ..., "member": ..., **your task}
    async with openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key) as client:
        messages = [{"role": "user", "content": f"Puzzle {task['seed']} ({task['level']}): what comes next?"}]
        reply = await client.chat.completions.create(model="my-model", messages=messages, max_tokens=512)
    score = 1.0 if "42" in (reply.choices[0].message.content or "") else 0.0  # your verifier
    return score, {"success": score}


serve_episodes(play)
