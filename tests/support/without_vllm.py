"""``python -m support.without_vllm fit ...``: the CLI as on a machine without vLLM.

A fake, named so: vLLM is installed in the test environment, so it is hidden (``import vllm`` fails with
`ModuleNotFoundError`, and `importlib.util.find_spec` finds nothing) before the CLI runs.
"""

from __future__ import annotations

import sys

sys.modules["vllm"] = None  # type: ignore[assignment]

from roll_lightning.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
