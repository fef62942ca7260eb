"""The Python example in docs/writing-an-env.md is real: served as written, it passes the conformance suite."""

from __future__ import annotations

import re
from pathlib import Path

from env_servers.conformance import run_conformance
from roll_lightning.env_client.local import launch_local_server

DOC = Path(__file__).resolve().parent.parent / "docs" / "writing-an-env.md"


def test_writing_an_env_example_conforms(tmp_path, monkeypatch):
    code = re.search(r"```python\n# my_envs/counter.py\n(.*?)```", DOC.read_text(), re.S)
    assert code, "the worked example is missing from docs/writing-an-env.md"
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "counter.py").write_text(code.group(1))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    server = launch_local_server(["countdown"], extra_args=["--import", "my_envs.counter"])
    try:
        lines: list[str] = []
        results = run_conformance(server.address, "countdown", report=lines.append)
        assert not [name for name, outcome in results.items() if outcome.failed], "\n".join(lines)
    finally:
        server.stop()


def test_the_rules_list_matches_the_suite_one_to_one():
    """docs/writing-an-env.md's "Rules a server must follow" names every check of the suite, once, in order."""
    from env_servers.conformance import CHECKS

    section = DOC.read_text().split("## Rules a server must follow", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\d+\. \*\*`([a-z-]+)`\*\*", section, re.M)
    assert named == list(CHECKS)
