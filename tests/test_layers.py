"""The import graph is a layered house: each part of `roll_lightning` imports only parts on lower floors (lazy
imports inside functions and type-checking imports count too), so there is no package cycle; the env servers
import nothing of the trainer but the generated protocol stubs; and docs/architecture.md's table names every
part. Read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "roll_lightning"

FLOORS: list[set[str]] = [  # bottom first (docs/architecture.md draws the same picture)
    {"protocol", "_compat", "quiet", "settings", "algorithms", "models", "checkpoints"},  # stubs, pure parts
    {"env_client", "agent_client"},  # the env client (grpc only, no torch); a long-running agent's loop (httpx)
    {"rollout", "exits"},  # episodes, engines, the scheduler, the datamodule; how a run ends
    {"training"},  # the LightningModule, its weight sync and GPU handoff, configs, LoRA
    {"callbacks", "checks"},  # optional callbacks; the GPU check
    {"cli"},
    {"__main__"},
]


def part_of(path: Path) -> str:
    """The top-level part of `roll_lightning` a file belongs to (a subpackage, or a module of its own)."""
    first = path.relative_to(PACKAGE).parts[0]
    return first.removesuffix(".py")


def imported_parts(path: Path) -> set[str]:
    """The `roll_lightning` parts a file imports, wherever the import statement is."""
    parts: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            pieces = name.split(".")
            if (
                pieces[0] == "roll_lightning"
                and len(pieces) > 1
                and ((PACKAGE / pieces[1]).exists() or (PACKAGE / f"{pieces[1]}.py").exists())
            ):
                parts.add(pieces[1])
    return parts


def floor_of(part: str) -> int:
    for floor, parts in enumerate(FLOORS):
        if part in parts:
            return floor
    raise AssertionError(f"roll_lightning/{part} is on no floor: add it to FLOORS (and to docs/architecture.md)")


def test_every_import_goes_down_the_house() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "v1" in path.parts:  # generated stubs
            continue
        here = part_of(path)
        if here == "__init__":
            continue
        for other in imported_parts(path) - {here}:
            if floor_of(other) >= floor_of(here):
                upward.append(f"{path.relative_to(ROOT)} ({here}, floor {floor_of(here)}) imports {other}")
    assert not upward, "\n".join(upward)


ROLLOUT_FLOORS: list[set[str]] = [  # the rooms of roll_lightning/rollout, bottom first (docs/architecture.md)
    {"prompts", "errors"},  # prompt tokens, pictures, tool calls; the config error
    {"engines"},  # vLLM, transformers, replicas
    {"episodes"},  # one episode, its rows, a batch
    {"agents"},  # the user's agent program and its endpoint
    {"groups"},  # a group, the queue, the filters
    {"config"},  # the rollout's settings
    {"scheduling"},  # the producer and its parts
    {"handover", "runtime"},  # the engine's turns around an update; the loop thread, signals, env servers
    {"datamodule"},
]


def test_every_import_goes_down_the_rollouts_rooms() -> None:
    """Inside `roll_lightning/rollout/` each room (a subpackage, or a module of its own) imports only rooms on
    lower floors, so each reads on its own and there is no cycle between rooms."""
    rollout = PACKAGE / "rollout"

    def room(module: str) -> str:
        return module.split(".")[2] if module.count(".") >= 2 else "__init__"

    def floor(name: str) -> int:
        found = [i for i, rooms in enumerate(ROLLOUT_FLOORS) if name in rooms]
        assert found, f"roll_lightning/rollout/{name} is on no floor: add it to ROLLOUT_FLOORS"
        return found[0]

    upward = []
    for path in sorted(rollout.rglob("*.py")):
        here = path.relative_to(rollout).parts[0].removesuffix(".py")
        if here == "__init__":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("roll_lightning.rollout."):
                other = room(node.module)
                if other != here and floor(other) >= floor(here):
                    upward.append(f"{path.relative_to(ROOT)} ({here}, floor {floor(here)}) imports {node.module}")
    assert not upward, "\n".join(upward)
    rooms = {p.name.removesuffix(".py") for p in rollout.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert rooms - {"__init__"} == set().union(*ROLLOUT_FLOORS)


def test_every_part_has_a_floor() -> None:
    parts = {part_of(p) for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    for part in parts - {"__init__"}:
        floor_of(part)


def test_the_env_servers_import_only_the_protocol_stubs_of_the_trainer() -> None:
    trainer_imports = []
    for path in sorted((ROOT / "env_servers").rglob("*.py")):
        for part in imported_parts(path) - {"protocol"}:
            trainer_imports.append(f"{path.relative_to(ROOT)} imports roll_lightning.{part}")
    assert not trainer_imports, "\n".join(trainer_imports)


def test_the_trainer_imports_no_env() -> None:
    """The other direction: nothing in `roll_lightning` imports `env_servers` (it starts env servers, and builds
    `tiny-tools`' warm-up data, through their commands)."""
    env_imports = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            env_imports += [f"{path.relative_to(ROOT)} imports {n}" for n in names if n.split(".")[0] == "env_servers"]
    assert not env_imports, "\n".join(env_imports)


def test_the_architecture_table_names_every_part() -> None:
    table = (ROOT / "docs" / "architecture.md").read_text().split("## Where each part lives", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(roll_lightning/[\w/]+?|env_servers/[\w/]+?)/?(?:\.py)?`", table))
    folders = {f"roll_lightning/{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    folders |= {f"env_servers/{p.name}" for p in (ROOT / "env_servers").iterdir() if p.is_dir() and p.name[0] != "_"}
    missing = sorted(f for f in folders if not any(n == f or n.startswith(f + "/") for n in named))
    assert not missing, f"docs/architecture.md's table does not name {missing}"


def test_tests_mirror_the_packages_and_the_tier_lists_name_real_files() -> None:
    """``tests/<package>/`` tests ``roll_lightning/<package>/``; a test file moved without its entry in conftest's
    ``UNIT``/``SLOW`` would silently change tier."""
    tests = ROOT / "tests"
    lists = {  # read from the source: `import conftest` may find another folder's conftest.py
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse((tests / "conftest.py").read_text()).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper()
        and isinstance(node.value, ast.Set)
    }  # fmt: skip
    assert {"UNIT", "SLOW"} <= set(lists)
    assert not sorted(p for p in lists["UNIT"] | lists["SLOW"] if not (tests / p).is_file())
    # every package of the trainer has its tests in the folder of its name; the env servers' are in tests/servers/
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} | {"servers", "cli"}
    for folder in sorted(folders):
        assert list((tests / folder).rglob("test_*.py")), f"tests/{folder}/ has no tests"
    # at the top of tests/ only the tests of the whole repository (its docs, its README, this house)
    assert sorted(p.name for p in tests.glob("test_*.py")) == ["test_docs.py", "test_layers.py", "test_readme.py"]
    # tests/ is on sys.path (and on the PYTHONPATH of the processes tests start), so a test folder named like a
    # top-level package would be found as a namespace package and hide it in a process started elsewhere:
    # the env servers' tests are in tests/servers/, not tests/env_servers/
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert not sorted(p.name for p in tests.iterdir() if p.is_dir() and p.name in packages)
