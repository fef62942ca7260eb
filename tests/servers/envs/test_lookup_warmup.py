"""The scripted lookup conversations `tiny-tools` is warmed up on: in the trainer's message layout, whose replies
the hermes parser reads as the calls that were played, and which know the call format but not the task."""

from __future__ import annotations

import json

from env_servers.envs.lookup_warmup import RIGHT_CALL, SYSTEM_PROMPT, conversations
from roll_lightning.rollout.prompts.tool_calls import HermesParser


def test_the_warm_up_conversations_are_well_formed_calls_chosen_without_the_task() -> None:
    played = conversations(400, seed=1)
    assert played == conversations(400, seed=1)  # the same model from the same seed
    asked_box, first_calls, answers_after_lookup = 0, 0, []
    for messages in played:
        assert messages[0] == {"role": "system", "content": SYSTEM_PROMPT}
        box = int(messages[1]["content"].removeprefix("What is the code of box ").removesuffix("?"))
        roles = [m["role"] for m in messages[1:]]
        assert roles[:3] == ["user", "assistant", "tool"] and roles.count("assistant") <= 3
        last_code = None
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            (call,) = HermesParser().parse(message["content"])
            arguments = json.loads(call.arguments)
            if k == 2 and call.name == "lookup":
                first_calls += 1
                asked_box += arguments["box"] == box
            if call.name == "answer" and last_code is not None:
                answers_after_lookup.append(str(arguments["code"]) == last_code)
            if call.name == "lookup":
                last_code = messages[k + 1]["content"]
    assert abs(asked_box / first_calls - (RIGHT_CALL + (1 - RIGHT_CALL) / 9)) < 0.1  # the box: no better than told
    assert answers_after_lookup and all(answers_after_lookup)  # an answer gives the last code it read
