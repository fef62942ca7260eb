"""A long-running agent on `roll_lightning.agent_client` and the official `openai` client: one process plays
every episode it is handed, two calls each, and reports ``seed % 3`` as the reward. ``SERVICE_AGENT`` makes it
misbehave: ``give_up_odd`` raises in odd seeds' episodes, ``exit_at=N`` exits (status 7) in its N-th episode,
``silent_odd`` never ends odd seeds' episodes, ``stay`` ignores the end of the run. It writes its pid to stderr."""

import asyncio
import os
import signal
import sys

import openai

from roll_lightning.agent_client import Handed, serve_episodes

MODE = os.environ.get("SERVICE_AGENT", "")
played = 0
print(f"pid {os.getpid()}", file=sys.stderr, flush=True)


async def play(episode: Handed) -> tuple[float, dict[str, float]]:
    global played
    played += 1
    seed = episode.task["seed"]
    if MODE == f"exit_at={played}":
        print("exiting on purpose", file=sys.stderr, flush=True)
        os._exit(7)
    if MODE == "silent_odd" and seed % 2:
        await asyncio.sleep(600)
    async with openai.AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0) as client:
        messages = [{"role": "user", "content": f"Task {seed}."}]
        first = await client.chat.completions.create(model="mine", messages=messages, max_tokens=6)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
        await client.chat.completions.create(model="mine", messages=messages, max_tokens=6)
    if MODE == "give_up_odd" and seed % 2:
        raise ValueError(f"no answer for seed {seed}")
    return float(seed % 3), {"success": 1.0}


if MODE == "stay":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
serve_episodes(play)
if MODE == "stay":
    asyncio.run(asyncio.sleep(600))
