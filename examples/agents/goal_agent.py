"""A scripted agent, standard library only: it shows the policy a one-row board ("P__G": you, floor, the goal)
and asks for one move; the reward is 1 for the move toward the goal, 0 for the other, -0.1 for anything else.
Trained by `configs/agent.yaml` (docs/agents.md)."""

import json
import os
import random
import urllib.request

task = json.loads(os.environ["ROLL_TASK"])
rng = random.Random(task["seed"])
width = rng.randint(3, 6)
player, goal = rng.sample(range(width), 2)
board = "".join("P" if i == player else "G" if i == goal else "_" for i in range(width))
headers = {"content-type": "application/json", "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


answer = post(f"{os.environ['OPENAI_BASE_URL']}/chat/completions", {
    "model": "policy", "messages": [{"role": "user", "content": board}], "max_tokens": 1,
})  # fmt: skip
move = answer["choices"][0]["message"]["content"].strip()
right = "Right" if goal > player else "Left"
reward = 1.0 if move == right else 0.0 if move in ("Left", "Right") else -0.1
post(os.environ["ROLL_REWARD_URL"], {"reward": reward, "metrics": {"success": float(move == right)}})
