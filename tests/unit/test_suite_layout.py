"""Where the suite keeps its tests, as tests/README.md says: a command's
integration tests are found by its name, in
tests/integration/commands/test_<command>.py (`-` read as `_`)."""

from __future__ import annotations

import ast
from pathlib import Path

from pgqctl.cli import COMMANDS

TESTS = Path(__file__).resolve().parents[1]
COMMAND_TESTS = TESTS / "integration" / "commands"


def module_name(command: str) -> str:
    return "test_" + command.replace("-", "_")


def defined_tests(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    ]


def test_every_command_has_its_integration_tests_under_its_name() -> None:
    missing = [
        f"{name}: {COMMAND_TESTS.relative_to(TESTS.parent) / module_name(name)}.py"
        for name in COMMANDS
        if not (COMMAND_TESTS / f"{module_name(name)}.py").is_file()
    ]
    assert missing == []
    empty = [
        name for name in COMMANDS if not defined_tests(COMMAND_TESTS / f"{module_name(name)}.py")
    ]
    assert empty == []


def test_every_file_of_command_tests_names_a_command() -> None:
    # test_<command>.py, or test_<command>_<aspect>.py for a command's larger parts.
    names = sorted((module_name(n) for n in COMMANDS), key=len, reverse=True)
    strays = [
        path.name
        for path in COMMAND_TESTS.glob("test_*.py")
        if not any(path.stem == n or path.stem.startswith(n + "_") for n in names)
    ]
    assert strays == []


def test_every_folder_of_tests_is_a_package() -> None:
    # Test modules import each other and tests/support by absolute name.
    folders = {p.parent for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f) for f in folders if not (f / "__init__.py").is_file()) == []
