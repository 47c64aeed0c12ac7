"""The SQL by module: sql/queries/X.sql is the SQL of pgqctl/X.py (or the package pgqctl/X/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgqctl.errors import PgqctlError
from pgqctl.sql import blocks_in, sql_dir

PACKAGE = Path(__file__).resolve().parents[2] / "pgqctl"
NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def module_text(name: str) -> str:
    """The source of pgqctl/NAME.py, or of every module of pgqctl/NAME/."""
    single = PACKAGE / f"{name}.py"
    if single.is_file():
        return single.read_text()
    package = PACKAGE / name
    assert package.is_dir(), f"sql/queries/{name}.sql names no module pgqctl/{name}(.py)"
    return "\n".join(p.read_text() for p in sorted(package.glob("*.py")))


@pytest.mark.parametrize("path", sorted((sql_dir() / "queries").glob("*.sql")), ids=str)
def test_each_file_holds_the_sql_of_its_module(path: Path) -> None:
    names = NAME_LINE.findall(path.read_text())
    assert names, f"{path.name} has no block"
    source = module_text(path.stem)
    unused = [n for n in names if not re.search(rf"[\"']{n}[\"']", source)]
    assert unused == [], f"blocks of {path.name} that pgqctl/{path.stem} never uses"


def test_a_name_given_in_two_files_is_refused(tmp_path: Path) -> None:
    one, two = tmp_path / "one.sql", tmp_path / "two.sql"
    one.write_text("-- name: same\nSELECT 1;\n")
    two.write_text("-- name: other\nSELECT 2;\n-- name: same\nSELECT 3;\n")
    with pytest.raises(PgqctlError, match=r"'same' is named in both one\.sql and two\.sql"):
        blocks_in([one, two])
    assert blocks_in([one]) == {"same": "SELECT 1"}


def test_every_block_of_the_tree_loads_once() -> None:
    files = sorted((sql_dir() / "queries").glob("*.sql"))
    names = [n for f in files for n in NAME_LINE.findall(f.read_text())]
    assert len(blocks_in(files)) == len(names) == len(set(names))
