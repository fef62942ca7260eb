"""`bench/vs_trl.py`, ours beside TRL's `GRPOTrainer` (the real `trl`): one short round of both sides runs to a
table, the TRL side trains on the boards ours trains on, and its episodes follow the SmolLM2 recipe (system prompt,
reply prefix, stop string, the action the env receives)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import torch
from support.cli import ROOT, cli_env

from env_servers.envs.answer import parse_actions
from env_servers.envs.frozenlake import _VOCABULARY
from roll_lightning.env_client import EnvPool
from roll_lightning.env_client.local import launch_local_server
from roll_lightning.models.smollm import smollm2_path
from roll_lightning.rollout.engines.base import stop_string_end
from roll_lightning.rollout.runtime.loop import RolloutLoop
from roll_lightning.rollout.scheduling.ledger import group_seed

sys.path.insert(0, str(ROOT))
from bench.trl_recipe import Recipe, play_episodes  # noqa: E402


def test_one_round_of_ours_and_trl_runs_to_a_table(tmp_path: Path) -> None:
    out = tmp_path / "vs_trl"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "vs_trl.py"), "--minutes", "0.25", "--rounds", "1",
         "--variants", "ours", "trl", "--out", str(out)],
        cwd=ROOT, env=cli_env(tmp_path), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    medians = json.loads((out / "summary.json").read_text())["medians"]
    for variant in ("ours", "trl"):
        m = medians[variant]
        assert m["updates"] >= 2 and m["episodes_per_s"] > 0 and m["heldout_first"] is not None, (variant, m)
        assert f"| {variant} |" in done.stdout
    records = [json.loads(line) for line in (out / "trl-0" / "trl_metrics.jsonl").open()]
    updates = [r for r in records if r["kind"] == "update"]
    for k, update in enumerate(updates):  # 8 boards of 8 episodes, in our ledger's order of groups
        assert update["boards"] == sorted(group_seed(0, g, "train") for g in range(8 * k, 8 * k + 8)), k
        assert update["episodes"] == 64 and update["gen_tokens"] == update["env_steps"]  # one token per move
        assert "trl/loss" in update, update  # TRL's own step logged
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals[0]["elapsed_s"] == 0 and evals[0]["episodes"] == 128 and Path(evals[0]["ckpt"]).is_dir()


def test_the_trl_side_plays_the_smollm2_recipe(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recipe = Recipe.from_config(ROOT / "configs" / "frozenlake_llm.yaml", max_context_tokens=1024)
    assert (recipe.reply_prefix, recipe.stop, recipe.max_new_tokens) == ("<answer>", ("</answer>",), 6)
    assert (recipe.group_size, recipe.batch_episodes, recipe.mini_batches, recipe.norm_by_std) == (8, 16, 1, False)
    recipe = dataclasses.replace(recipe, max_turns=2)
    folder = smollm2_path(tmp_path / "cache")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    server, loop = launch_local_server([recipe.env_id]), RolloutLoop("test-trl-side")
    pool = EnvPool([server.address])
    try:
        loop.call(pool.start())
        sessions = [loop.call(pool.open(recipe.env_id, recipe.env_config)) for _ in range(4)]
        seeds = [group_seed(0, 0, "train")] * 4
        results, _ = play_episodes(
            model, tokenizer, recipe, sessions, seeds, loop.call, generator=torch.Generator().manual_seed(0)
        )
    finally:
        loop.call(pool.close())
        loop.close()
        server.stop()
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    for result in results:
        prompt = decode(result.prompt_ids)
        assert prompt.startswith("<|im_start|>system\n" + recipe.system_prompt) and prompt.endswith(
            "<|im_start|>assistant\n<answer>"
        ), prompt
        replies, reply = [], []
        for token, sampled in zip(result.completion_ids, result.env_mask, strict=True):
            if sampled:
                reply.append(token)
            elif reply:
                replies, reply = [*replies, reply], []
        replies += [reply] if reply else []
        assert len(replies) == result.turns >= 1
        for ids in replies:  # ends at eos, at the token that completes "</answer>", or at the token budget
            ended = ids[-1] == tokenizer.eos_token_id or stop_string_end(decode, ids, recipe.stop) == len(ids)
            assert ended or len(ids) == recipe.max_new_tokens, decode(ids)
        # the env parsed "<answer>" + the reply: its invalid count is the strict parse's
        refused = [parse_actions("<answer>" + tokenizer.decode(ids, skip_special_tokens=True), _VOCABULARY) is None
                   for ids in replies]  # fmt: skip
        assert result.invalid == sum(refused), [decode(ids) for ids in replies]
