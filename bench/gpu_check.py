"""The GPU check: run it first on a new GPU machine. One command, one table (roll_lightning/checks/gpu.py says
what each row shows):

    .venv/bin/python bench/gpu_check.py [--model tiny] [--json out.json]

Exit status 0 when every check passed, 1 when one failed, 2 when no CUDA device is visible.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from roll_lightning.checks.gpu import run_all, summary_json, table
from roll_lightning.models.resolve import resolve_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny", help="a built-in model name or a local folder (default: tiny)")
    ap.add_argument("--json", type=Path, default=None, help="also write the outcomes as JSON here")
    args = ap.parse_args()
    model = Path(args.model) if Path(args.model).is_dir() else resolve_model(args.model)
    outcomes = run_all(model, report=lambda o: print(f"{o.status:4}  {o.name}: {o.detail}", flush=True))
    print()
    print(table(outcomes))
    if args.json:
        args.json.write_text(summary_json(outcomes))
    if outcomes[0].status == "SKIP":
        print("\nno CUDA device visible: nothing to check here (the CPU paths are covered by the test suite)")
        return 2
    return 1 if any(o.status == "FAIL" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
