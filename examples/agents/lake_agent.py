"""An agent that plays one of the built-in envs, FrozenLake, through the project's own env client: it opens a
session on the env server at ROLL_ENV_ADDRESS, shows the policy the rules and each board in one growing
conversation (official `openai` client), sends every reply to the env as its move, and reports the episode's
return as its reward. docs/agents.md, "An agent on a built-in env"."""

import asyncio
import json
import os
import urllib.request

import openai

from roll_lightning.env_client import EnvPool


async def play(task: dict) -> tuple[float, float]:
    client = openai.AsyncOpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    async with EnvPool([os.environ.get("ROLL_ENV_ADDRESS", "127.0.0.1:50051")]) as pool:
        session = await pool.open("frozenlake", {"max_steps": task["moves"]})
        first = await session.reset(seed=task["seed"])  # a group's members play the same map
        messages = [
            {"role": "system", "content": session.spec.instruction},
            {"role": "user", "content": first.observation},
        ]
        total, success = 0.0, 0.0
        while True:
            answer = await client.chat.completions.create(model="any", messages=messages, max_tokens=512)
            reply = answer.choices[0].message.content or ""
            out = await session.step(reply)
            total, success = total + out.reward, out.metrics.get("success", success)
            if out.terminated or out.truncated:  # the env ends it: at the goal, in a hole, or after its moves
                break
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": out.observation}]
        await session.close()
    return total, success


task = json.loads(os.environ["ROLL_TASK"])
reward, success = asyncio.run(play(task))
body = json.dumps({"reward": reward, "metrics": {"success": success}}).encode()
headers = {"content-type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["ROLL_REWARD_URL"], body, headers))
