"""Which module may import which: the floors of the layout in README.md.

`pgqctl/text.py` is the bottom floor (printable, escapes, durations) that
views and the worker's log stand on; the views (`pgqctl/output/`) stand on
it, and only the commands stand on them. Imports are read from the source,
those inside functions included.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pgqctl"
# What the floor may import of pgqctl: nothing but the error classes.
TEXT_MAY_IMPORT = {"pgqctl.errors"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports: `from pgqctl import output` counts as
    pgqctl.output, a relative import as the absolute name it stands for."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def reaches(imported: set[str], module: str) -> list[str]:
    return sorted(m for m in imported if m == module or m.startswith(module + "."))


def sources(*paths: str) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        path = PACKAGE / p
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return found


def test_text_imports_no_module_of_pgqctl_and_no_library() -> None:
    imported = imports_of(PACKAGE / "text.py")
    ours = {m for m in imported if m.split(".")[0] == "pgqctl"} - TEXT_MAY_IMPORT
    assert not ours, f"pgqctl/text.py is the bottom floor: it imports {sorted(ours)}"
    libraries = {
        m
        for m in imported
        if m.split(".")[0] not in ("pgqctl", "__future__", *sys.stdlib_module_names)
    }
    assert not libraries, f"pgqctl/text.py imports {sorted(libraries)}"


@pytest.mark.parametrize(
    "path",
    sources("worker", "runner.py", "worklog.py"),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_worker_and_its_log_import_no_view(path: Path) -> None:
    assert not reaches(imports_of(path), "pgqctl.output"), (
        f"pgqctl/{path.relative_to(PACKAGE)} imports the views: take text helpers from pgqctl.text"
    )


def test_only_the_commands_import_the_views() -> None:
    # The front ends: the command line and the web page.
    allowed = {PACKAGE / "cli.py", *sources("commands", "output", "web")}
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in sources(".")
        if path not in allowed and reaches(imports_of(path), "pgqctl.output")
    )
    assert not importers, f"library modules that import pgqctl.output: {importers}"


def test_the_views_package_imports_none_of_its_modules() -> None:
    # A command loads the views it uses, and no other (start-up time).
    assert imports_of(PACKAGE / "output" / "__init__.py") == set()
