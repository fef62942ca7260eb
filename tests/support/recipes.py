"""The CPU learning recipes as the learning tests run them: ``fit --config configs/<config>`` for a fixed number
of rollout steps, evaluating before the first update and after the last, each a subprocess with one torch thread.

They count rollout steps, not seconds, so how much of the machine they get changes how long they take, never what
they learn. That is what lets the suite start them as soon as it has collected them (`start_recipes`, called by
``tests/conftest.py``) at the lowest CPU priority: they run on whatever the rest of the suite leaves idle (the
suite's own processes always come first) and the learning tests, run last, collect them. The SmolLM2 recipe
(`ALONE`) is the exception: beside the suite it spent ~3.5x the CPU per step it spends alone (a 2-core AMD EPYC
Zen 3, docs/benchmarks.md "The test suite"), so it starts with every core when the learning tests begin, the rest
of the suite done, and its test is the last.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# test name -> (config, rollout steps, rollout steps between evaluations after the one at step 0, more arguments)
RECIPES: dict[str, tuple[str, int, int, tuple[str, ...]]] = {
    # 512 held-out levels, not the config's 128 (at 128 one evaluation moves by +-4 points by itself), 3 times
    "test_the_main_command_learns_sokoban": ("sokoban.yaml", 200, 100, ("--data.evaluation.episodes", "512")),
    "test_the_cpu_recipe_learns_frozenlake": ("frozenlake_learn.yaml", 400, 400, ()),
    "test_a_chat_model_learns_to_use_tools": ("lookup.yaml", 60, 60, ()),
    # the agent's path made absolute: the run's working folder is the recipe's own
    "test_a_policy_learns_through_the_users_agent_program": (
        "agent.yaml",
        60,
        60,
        (
            "--data.rollout.envs",
            json.dumps(
                [
                    {
                        "tag": "goal",
                        "env_id": "goal-agent",
                        "agent": {
                            "command": [sys.executable, str(ROOT / "examples" / "agents" / "goal_agent.py")],
                            "deadline_s": 60,
                        },
                    }
                ]
            ),
        ),
    ),
    # the GPU recipe's shape (vLLM engine, trajectory rows, weights streamed into vLLM) with SmolLM2, cut: episodes of
    # at most 4 turns (the recipe's 8 cost ~3x the tokens a row), 16 held-out boards, micro-batches of 1024 tokens
    "test_the_gpu_recipe_shape_learns_through_vllm": (
        "frozenlake_vllm.yaml",
        10,
        10,
        (
            "--data.rollout.episode.max_turns",
            "4",
            "--data.evaluation.episodes",
            "16",
            "--model.algorithm.max_tokens_per_micro",
            "1024",
        ),
    ),
}
# started with every core when the learning tests begin (tests/cli/test_learning.py), its test the last
ALONE = {"test_the_gpu_recipe_shape_learns_through_vllm"}
LOWEST_PRIORITY = 19  # nice value: the recipes get the CPU only when the rest of the suite leaves it idle
HANG_GUARD_S = 3600  # a recipe that is not done an hour after the suite started it is hung, not slow


class Recipe:
    """``fit --config configs/<config>`` for ``steps`` rollout steps (``more``: further command-line settings),
    evaluating at the start and every ``eval_every`` steps, a subprocess started now at the lowest CPU priority
    (``nice``) with one torch thread; `result` waits for it."""

    def __init__(
        self, config: str, steps: int, eval_every: int, more: tuple[str, ...], folder: Path, alone: bool = False
    ) -> None:
        """``alone``: started by `start` (or `result`) with every core at the normal priority, not now at the lowest."""
        self.config, self.more, self.alone = config, more, alone
        self.steps, self.eval_every, self.folder = steps, eval_every, folder
        self.stdout, self.stderr = (folder / "stdout.txt").open("w+"), (folder / "stderr.txt").open("w+")
        self.process: subprocess.Popen[str] | None = None
        if not alone:
            self.start()

    def start(self) -> None:
        """Start the run (once)."""
        if self.process is not None:
            return
        folder, threads = self.folder, os.cpu_count() if self.alone else 1
        env = {**os.environ, "ROLL_LIGHTNING_CACHE": str(folder / "cache"), "OMP_NUM_THREADS": str(threads)}
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "roll_lightning", "fit", "--config", str(ROOT / "configs" / self.config),
                "--model.rollout_steps", str(self.steps), "--trainer.val_check_interval", str(self.eval_every),
                # steps decide the end, not the config's wall-clock budget: the run may share the machine
                "--trainer.max_time", "null", "--trainer.default_root_dir", str(folder / "run"), *self.more,
            ],
            cwd=folder, env=env, stdout=self.stdout, stderr=self.stderr, text=True,
        )  # fmt: skip
        if not self.alone:  # set before the fit starts its env server (Python's start-up is longer): it inherits it
            os.setpriority(os.PRIO_PROCESS, self.process.pid, LOWEST_PRIORITY)

    def result(self) -> tuple[list[tuple[int, float]], list[dict[str, str]], str]:
        """The evaluations as (step, held-out success), the per-step training rows, and what the run printed on
        stdout (a file: progress lines and evaluation lines, as in a log file)."""
        self.start()
        assert self.process is not None
        returncode = self.process.wait(timeout=HANG_GUARD_S)
        stdout, stderr = (Path(f.name).read_text() for f in (self.stdout, self.stderr))
        assert returncode == 0, stderr[-3000:]
        rows = list(csv.DictReader(next((self.folder / "run").rglob("metrics.csv")).open()))
        evals = [(int(r["step"]), float(r["eval/success_rate"])) for r in rows if r["eval/success_rate"]]
        assert [step for step, _ in evals] == list(range(0, self.steps + 1, self.eval_every))  # from before any update
        train = [r for r in rows if r["rollout/success_rate"]]
        assert [int(r["step"]) for r in train] == list(range(1, self.steps + 1))  # the x axis: steps from 1
        return evals, train, stdout

    def diagnosis(self) -> str:
        """What a failed learning assertion shows: every evaluation (success, invalid replies, the policy version
        that played), the training rows in windows of 50 steps, and the end of the run's stderr (its warnings)."""
        rows = list(csv.DictReader(next((self.folder / "run").rglob("metrics.csv")).open()))
        lines = [
            f"eval at step {r['step']}: success {r['eval/success_rate']}, invalid {r.get('eval/invalid_action_rate')},"
            f" played by policy version {r.get('eval/policy_version')}"
            for r in rows
            if r.get("eval/success_rate")
        ]
        train = [r for r in rows if r.get("rollout/success_rate")]
        for start in range(0, len(train), 50):
            part = train[start : start + 50]
            means = {
                k: sum(float(r[k] or 0) for r in part) / len(part)
                for k in (
                    "rollout/success_rate",
                    "rollout/invalid_action_rate",
                    "train/grad_norm",
                    "train/logprob_gap",
                    "train/ratio_max",
                    "rollout/engine_busy_fraction",
                )  # fmt: skip
                if k in part[0]
            }
            peaks = {
                k: max(float(r[k] or 0) for r in part) for k in ("train/grad_norm", "train/ratio_max") if k in part[0]
            }
            lines.append(
                f"steps {part[0]['step']}-{part[-1]['step']}: "
                + ", ".join(f"{k} {v:.3f}" for k, v in means.items())
                + "; max "
                + ", ".join(f"{k} {v:.3f}" for k, v in peaks.items())
            )
        lines += self._replies()
        stderr = Path(self.stderr.name).read_text().splitlines()
        return "\n".join([*lines, "stderr:", *stderr[-15:]])

    def _replies(self) -> list[str]:
        """What the policy wrote at each `TrajectoryDump` (most common first): a collapse shows which reply took
        over, and when."""
        lines = []
        for dump in sorted((self.folder / "run").rglob("trajectories/step_*.jsonl")):
            replies = Counter(t["reply"] for line in dump.open() for t in json.loads(line)["turns"])
            lines.append(f"replies at {dump.stem}: " + ", ".join(f"{r!r} x{n}" for r, n in replies.most_common(6)))
        return lines

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.stdout.close()
        self.stderr.close()


def start_recipes(test_names: list[str], folder: Path) -> dict[str, Recipe]:
    """The recipe of each learning test in ``test_names`` (others are ignored), each under ``folder/<name>``, started
    now but for those in `ALONE`."""
    started = {}
    for name in (n for n in test_names if n in RECIPES):
        (folder / name).mkdir(parents=True)
        started[name] = Recipe(*RECIPES[name], folder / name, alone=name in ALONE)
    return started
