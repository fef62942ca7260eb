"""The Python example in docs/writing-an-env.md is real: served as written, it passes the conformance suite."""

from __future__ import annotations

import re
from pathlib import Path

from support.conformance import conforms

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
        conforms(server.address, "countdown")
    finally:
        server.stop()


def test_the_rules_list_matches_the_suite_one_to_one():
    """docs/writing-an-env.md's "Rules a server must follow" names every check of the suite, once, in order."""
    from env_servers.conformance import CHECKS

    section = DOC.read_text().split("## Rules a server must follow", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\d+\. \*\*`([a-z-]+)`\*\*", section, re.M)
    assert named == list(CHECKS)


ENVIRONMENTS = DOC.parent / "environments.md"


def test_the_ecosystem_tables_commands_name_envs_that_resolve():
    """Every concrete env id in docs/environments.md's one-line commands resolves (placeholders like my_env aside)."""
    from env_servers.registry import get_env

    commands = re.findall(r"`python -m env_servers (?:serve|openenv) ([^`]+)`", ENVIRONMENTS.read_text())
    ids = [word for command in commands for word in command.split() if not word.startswith("-") and not word.isdigit()]
    concrete = [env_id for env_id in ids if "my_" not in env_id and "://" not in env_id and not env_id.isupper()]
    assert {"gem:game:GuessTheNumber-v0-easy", "textarena:GuessTheNumber-v0", "frozenlake"} <= set(concrete)
    for env_id in concrete:
        get_env(env_id)


def test_the_openenv_client_example_runs_against_our_server():
    from support.openenv_envs import running

    code = re.search(r"```python\n(from openenv import GenericEnvClient.*?)```", ENVIRONMENTS.read_text(), re.S)
    assert code, "the OpenEnv client example is missing from docs/environments.md"
    with running("-m", "env_servers", "openenv", "frozenlake", "--port", "0") as served:
        namespace: dict = {}
        exec(compile(code.group(1).replace("http://127.0.0.1:8000", served.url), "environments.md", "exec"), namespace)
        assert namespace["out"].observation["text"] and namespace["first"].observation["info"]["seed"] == 3


ROOT_DIR = DOC.parent.parent
DOCS = sorted(ROOT_DIR.glob("docs/*.md"))
PATH_IN_CODE = re.compile(r"`((?:docs|bench|configs|roll_lightning|env_servers|tests|protos|\.ci)/[\w./-]*[\w/])`")


def test_every_link_and_named_file_in_the_readme_and_docs_exists():
    """The README and every page under docs/: each relative link and each repository path written in code
    (`docs/x.md`, `bench/y.py`) points at a file that exists (benchmark outputs under bench/results/ aside: they
    are not committed)."""
    broken = []
    for page in [ROOT_DIR / "README.md", *DOCS]:
        text = page.read_text()
        for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
            if "://" not in target and not target.startswith("#"):
                if not (page.parent / target.split("#")[0]).exists():
                    broken.append(f"{page.name}: link {target}")
        for path in PATH_IN_CODE.findall(text):
            if not any(c in path for c in "*<>{}") and not path.startswith("bench/results/"):
                if not (ROOT_DIR / path).exists():
                    broken.append(f"{page.name}: {path}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_every_docs_page():
    readme = (ROOT_DIR / "README.md").read_text()
    unlinked = [page.name for page in DOCS if f"](docs/{page.name})" not in readme]
    assert not unlinked, f"the README's documentation table does not link {unlinked}"


def test_every_shipped_config_shows_the_keys_to_change_first():
    """Each config's header names the few keys a user changes first, and the file sets each of them (so its value is
    right there to change)."""
    import yaml

    for config in sorted((ROOT_DIR / "configs").glob("*.yaml")):
        text = config.read_text()
        line = re.search(r"^# Change first: ([\w., ]+?) \(", text, re.M)
        assert line, f"{config.name} does not say which keys to change first"
        data = yaml.safe_load(text)
        for key in line.group(1).split(", "):
            node = data
            for part in key.split("."):
                assert isinstance(node, dict) and part in node, f"{config.name} names {key} but does not set it"
                node = node[part]
