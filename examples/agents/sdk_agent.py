"""An agent written with the OpenAI Agents SDK (`pip install openai-agents`), trained as it is: only its client
points at the trainer (OPENAI_BASE_URL and OPENAI_API_KEY, which the trainer sets). It asks which way the goal
is on a one-row board; the reward is 1 for the right word, and partial credit for the letters of it the answer
has (so a policy that never says it yet still gets a signal). docs/agents.md, "An agent framework"."""

import asyncio
import json
import os
import random
import urllib.request

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)  # the SDK would otherwise send traces to OpenAI
task = json.loads(os.environ["ROLL_TASK"])
rng = random.Random(task["seed"])
player, goal = rng.sample(range(5), 2)
board = "".join("P" if i == player else "G" if i == goal else "_" for i in range(5))
right = "Right" if goal > player else "Left"

agent = Agent(
    name="walker",
    instructions="You are P on a one-row board; G is the goal. Answer Left or Right.",
    model=OpenAIChatCompletionsModel(model="any-name", openai_client=AsyncOpenAI()),
)
result = asyncio.run(Runner.run(agent, board, max_turns=1))
answer = str(result.final_output)
reward = 1.0 if right in answer else sum(c in answer for c in right) / (2 * len(right))
body = json.dumps({"reward": reward, "metrics": {"success": float(right in answer)}}).encode()
headers = {"content-type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["ROLL_REWARD_URL"], body, headers))
