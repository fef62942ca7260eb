"""An agent written with the official `openai` client, as a user would: it reads the endpoint from the
environment (OPENAI_BASE_URL, OPENAI_API_KEY), its task from ROLL_TASK, plays two turns and reports a reward to
ROLL_REWARD_URL (unless NO_REWARD is set: an agent that forgets to)."""

import json
import os
import urllib.request

import openai

task = json.loads(os.environ["ROLL_TASK"])
client = openai.OpenAI(max_retries=0)  # the SDK reads OPENAI_BASE_URL and OPENAI_API_KEY itself
messages = [{"role": "user", "content": f"Task {task['seed']}."}]
first = client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
client.chat.completions.create(model="policy", messages=messages, max_tokens=6)
if not os.environ.get("NO_REWARD"):
    body = json.dumps({"reward": task["seed"] % 3, "metrics": {"success": 1.0}}).encode()
    request = urllib.request.Request(os.environ["ROLL_REWARD_URL"], body, {"content-type": "application/json"})
    urllib.request.urlopen(request).read()
