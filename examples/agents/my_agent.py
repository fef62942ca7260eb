import json
import os
import urllib.request

import openai

task = json.loads(os.environ["ROLL_TASK"])  # {"seed": ..., "group": ..., "member": ..., **your task}
client = openai.OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
messages = [{"role": "user", "content": f"Puzzle {task['seed']} ({task['level']}): what comes next?"}]
# any model name; max_tokens above the run's sampling.max_new_tokens is clamped to it
reply = client.chat.completions.create(model="my-model", messages=messages, max_tokens=512)
score = 1.0 if "42" in reply.choices[0].message.content else 0.0  # your verifier
body = json.dumps({"reward": score, "metrics": {"success": score}}).encode()
headers = {"content-type": "application/json"}
urllib.request.urlopen(urllib.request.Request(os.environ["ROLL_REWARD_URL"], body, headers))
