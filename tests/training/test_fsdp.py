"""The same rollout batch gives the same update on 1 process and on 2 FSDP2 ranks (gloo, run as a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support.handmade_batch import handmade_batch
from test_module import fit

from roll_lightning.module import AgentRLModule
from roll_lightning.training import AlgorithmConfig, OptimConfig

TESTS = Path(__file__).parent.parent


@pytest.mark.parametrize(
    "algorithm", [{"estimator": "grpo"}, {"estimator": "grpo", "loss": "gspo"}], ids=["ppo", "gspo"]
)
def test_two_fsdp2_ranks_match_one_process(
    model_dir: Path, tokenizer: Any, tmp_path: Path, algorithm: dict[str, Any]
) -> None:
    single = AgentRLModule(str(model_dir), algorithm=AlgorithmConfig(**algorithm), optim=OptimConfig(lr=1e-3))
    fit(single, handmade_batch(model_dir, tokenizer), tmp_path / "single")

    out = tmp_path / "fsdp.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, str(TESTS / "support" / "fsdp_update.py"), str(model_dir), str(out), json.dumps(algorithm)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    sharded = torch.load(out)
    expected = single.actor.state_dict()
    assert set(sharded) == set(expected)
    original = AgentRLModule._load(model_dir).state_dict()
    moved = sum(not torch.equal(expected[k], original[k]) for k in expected)
    assert moved > len(expected) // 2  # the update touched most tensors
    for name, tensor in expected.items():
        delta = (sharded[name] - tensor).abs().max().item()
        moved_by = (tensor - original[name]).abs().max().item()
        assert delta <= 1e-5 + 1e-3 * moved_by, f"{name}: differs by {delta:.2e}; the update moved it {moved_by:.2e}"
