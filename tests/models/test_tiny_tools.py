"""``tiny-tools``' warm-up: its data comes from the env servers' command, and only the replies are trained on."""

from __future__ import annotations

from env_servers.envs.lookup_warmup import conversations, tool_specs
from roll_lightning.models.tiny import build_tokenizer
from roll_lightning.models.tiny_tools import _masked, warmup_data


def test_the_warm_up_data_comes_from_the_env_servers_command() -> None:
    """The trainer imports no env: `warmup_data` runs ``python -m env_servers.envs.lookup_warmup`` and gets what
    the env module makes in-process."""
    tools, played = warmup_data(5, seed=2)
    assert tools == tool_specs() and played == conversations(5, seed=2)


def test_only_the_replies_are_trained_on() -> None:
    tokenizer, tools = build_tokenizer(512), tool_specs()
    messages = conversations(1, seed=3)[0]
    ids, mask = _masked(tokenizer, messages, tools)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    trained = tokenizer.decode(ids[mask.bool()])
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    assert trained == "".join(f"{reply}<|im_end|>" for reply in replies)
