"""The README's two set-up commands stay true: the test command is exactly what `.ci/run` runs, and the main
command's config and model names exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _quickstart_commands() -> list[str]:
    quickstart = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quickstart, re.S)


def test_the_readme_test_command_is_what_ci_runs() -> None:
    main, tests = _quickstart_commands()[:2]
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert ci == [tests]


def test_the_main_command_names_a_shipped_config_and_a_built_in_model() -> None:
    import yaml

    from roll_lightning.models.resolve import BUILT_IN

    main = _quickstart_commands()[0]
    config = re.search(r"--config (\S+)", main).group(1)  # type: ignore[union-attr]
    assert config == "configs/sokoban.yaml" and main.endswith(f"fit --config {config}")  # as written: no overrides
    model = yaml.safe_load((ROOT / config).read_text())["model"]["model"]
    assert model in BUILT_IN  # built here: nothing to download, no optional package
    assert "[train]" in main
