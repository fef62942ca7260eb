"""``tiny-tools``: the tiny chat model taught the Hermes tool-call format, and not the task, offline in minutes.

SmolLM2-135M writes almost no well-formed call, leaving RL nothing to reinforce (docs/benchmarks.md).

CLI: ``python -m roll_lightning.models.tiny_tools OUT_DIR [--seed N] [--steps N]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from roll_lightning.models.tiny import MESSAGES_TEMPLATE, build_tiny_model, build_tokenizer, cache_name, cached_build

# a line per tool: Qwen2.5's JSON schemas would fill two thirds of every prompt
CHAT_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n' }}{% endif %}"
    "{{ 'Tools:' }}{% for tool in tools %}{% set f = tool.function if tool.function is defined else tool %}"
    "{{ '\n' + f.name + '(' + (f.parameters.properties | list | join(', ')) + '): ' + f.description }}"
    "{% endfor %}"
    '{{ \'\nCall one as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n\' }}'
    "{% endif %}" + MESSAGES_TEMPLATE
)
RECIPE_VERSION = 1
BATCH, LR = 16, 3e-3  # conversations per update; peak learning rate, decayed linearly to 0


def warmup_data(n: int, seed: int) -> tuple[list[dict[str, Any]], list[list[dict[str, str]]]]:
    """The lookup env's tool specs and ``n`` scripted conversations with it (`env_servers.envs.lookup_warmup`), made
    by the env servers' own command: the trainer imports no env."""
    command = [sys.executable, "-m", "env_servers.envs.lookup_warmup", str(n), "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tiny-tools: {' '.join(command[1:])} failed: {done.stderr.strip()[-2000:]}")
    data = json.loads(done.stdout)
    return data["tools"], data["conversations"]


def build_tiny_tools_model(out_dir: str | Path, *, seed: int = 0, steps: int = 1500) -> Path:
    """Build `tiny-tools` into ``out_dir``: tokenizer, random model, then ``steps`` warm-up updates."""
    import torch
    from transformers import AutoModelForCausalLM

    tools, conversations = warmup_data(400, seed=10_000)
    plain = build_tokenizer(512)  # renders the corpus the tool tokenizer is trained on
    plain.chat_template = CHAT_TEMPLATE
    corpus = [plain.apply_chat_template(m, tools=tools, tokenize=False) for m in conversations]
    tokenizer = build_tokenizer(1024, corpus=corpus)
    tokenizer.chat_template = CHAT_TEMPLATE
    out = build_tiny_model(out_dir, seed=seed, hidden_size=128, num_heads=4, vocab_size=1024)
    tokenizer.save_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    model.resize_token_embeddings(-(-len(tokenizer) // 64) * 64)
    rows = [_masked(tokenizer, m, tools) for m in warmup_data(steps * BATCH, seed=seed)[1]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    for step in range(steps):
        loss = _loss(model, rows[step * BATCH : (step + 1) * BATCH], tokenizer.pad_token_id)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.save_pretrained(out)
    return out


def _masked(tokenizer: Any, messages: list[dict[str, str]], tools: list[dict]) -> tuple[Any, Any]:
    """A conversation's token ids and a mask of its replies."""
    import torch

    def ids_of(k: int, generation_prompt: bool = False) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages[:k], tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return tokenizer.encode(text, add_special_tokens=False)

    ids, mask = [], []
    for k, message in enumerate(messages, start=1):
        if message["role"] == "assistant":
            prompt = ids_of(k - 1, generation_prompt=True)
            mask += [False] * (len(prompt) - len(ids))
            ids = prompt
        new = ids_of(k)[len(ids) :]
        if message["role"] == "assistant":  # the reply through <|im_end|>, not the newline the template adds
            end = new.index(tokenizer.eos_token_id) + 1
            mask += [True] * end + [False] * (len(new) - end)
        else:
            mask += [False] * len(new)
        ids += new
    return torch.tensor(ids), torch.tensor(mask)


def _loss(model: Any, rows: list[tuple[Any, Any]], pad_id: int) -> Any:
    """Mean next-token loss over the replies' tokens of a right-padded batch."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id)
    target = torch.zeros((len(rows), width))
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for k, (row, mask) in enumerate(rows):
        ids[k, : len(row)], target[k, : len(row)], attention[k, : len(row)] = row, mask.float(), 1
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (losses * target[:, 1:]).sum() / target[:, 1:].sum()


def tiny_tools_model(cache_dir: str | Path, seed: int = 0) -> Path:
    name = cache_name(f"tiny-tools-v{RECIPE_VERSION}", seed, {})
    return cached_build(Path(cache_dir) / name, lambda tmp: build_tiny_tools_model(tmp, seed=seed))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the tiny model that writes tool calls (offline).")
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1500)
    args = ap.parse_args(argv)
    print(build_tiny_tools_model(args.out_dir, seed=args.seed, steps=args.steps))


if __name__ == "__main__":
    main()
