"""Scripted conversations with the lookup env: a player that knows the Hermes tool-call format and not the task
(it looks up the asked box half the time, any box otherwise, and answers at random or with the last code read).
The trainer's `tiny-tools` model is warmed up on them (`roll_lightning/models/tiny_tools.py`), through this
command, so the trainer imports no env.

CLI: ``python -m env_servers.envs.lookup_warmup N [--seed S]`` prints ``{"tools": [...], "conversations": [...]}``:
the env's tools as chat-template tool specs, and N conversations as chat messages.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

from env_servers.api import Action, ToolCall
from env_servers.envs.lookup import TOOLS, LookupConfig, LookupEnv

SYSTEM_PROMPT = "Answer the question with tool calls."  # configs/lookup.yaml uses it too
RIGHT_CALL = 0.5  # how often the player looks up the asked box
ENV_CONFIG = {"max_steps": 3, "boxes": 9}  # as configs/lookup.yaml


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """One call as the Hermes format writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _reply(rng: random.Random, box: int, code: str | None) -> str:
    if rng.random() < 0.5:
        return call_text("answer", {"code": int(code) if code else rng.randint(10, 99)})
    return call_text("lookup", {"box": box if rng.random() < RIGHT_CALL else rng.randint(1, ENV_CONFIG["boxes"])})


def conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    """``n`` conversations with the real lookup env, as chat messages (the same ones for the same seed)."""
    rng, env = random.Random(seed), LookupEnv(LookupConfig(**ENV_CONFIG))
    out = []
    for _ in range(n):
        observation, info = env.reset(rng.randrange(2**31))
        messages, code = [{"role": "system", "content": SYSTEM_PROMPT}], None
        for turn in range(ENV_CONFIG["max_steps"]):
            messages.append({"role": "user", "content": observation})
            reply = _reply(rng, info["box"], code)
            messages.append({"role": "assistant", "content": reply})
            call = json.loads(reply.split("\n")[1])
            arguments = json.dumps(call["arguments"])
            obs, _, done, truncated, _ = env.step(Action(reply, (ToolCall(f"call_{turn}_0", call["name"], arguments),)))
            for r in obs.tool_results:
                messages.append({"role": "tool", "content": r.content, "name": r.name, "tool_call_id": r.call_id})
                if r.name == "lookup" and not r.is_error:
                    code = r.content
            if done or truncated:
                break
            observation = obs.text
        out.append(messages)
    return out


def tool_specs() -> list[dict[str, Any]]:
    """The env's tools as a chat template takes them."""
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
        for t in TOOLS
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Scripted lookup conversations (tiny-tools' warm-up data) as JSON.")
    ap.add_argument("n", type=int, help="how many conversations")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    json.dump({"tools": tool_specs(), "conversations": conversations(args.n, args.seed)}, sys.stdout)


if __name__ == "__main__":
    main()
