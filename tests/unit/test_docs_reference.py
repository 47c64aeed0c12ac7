"""The docs' generated parts are what the code prints, and every command has its page."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from cogapp import Cog

from tests.support.docs_help import commands, help_text

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# The command that regenerates every cog block; a block outside these files
# would be checked here but left stale by it.
REGENERATE = ".venv/bin/cog -r docs/*.md"
REGENERATED = sorted(DOCS.glob("*.md"))
COG_MARKER = "<!-- [[[cog "


def cog_files() -> list[Path]:
    """Every Markdown file of the repository's docs that holds a cog block."""
    candidates = [README, *sorted(DOCS.rglob("*.md"))]
    return [path for path in candidates if COG_MARKER in path.read_text(encoding="utf-8")]


def top_level_commands() -> list[str]:
    return list(dict.fromkeys(path[0] for path in commands()))


def test_the_generated_files_are_the_reference_and_the_table() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in cog_files()}
    assert {"docs/reference.md", "docs/table.md"} <= names


def test_the_regenerate_command_covers_every_cog_block() -> None:
    stray = [path.relative_to(ROOT).as_posix() for path in cog_files() if path not in REGENERATED]
    assert not stray, f"cog blocks that `{REGENERATE}` does not rewrite: {stray}"


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.relative_to(ROOT).as_posix()) for p in cog_files()]
)
def test_the_generated_docs_are_what_the_code_prints(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    text = path.read_text(encoding="utf-8")
    regenerated = Cog().process_string(text, fname=str(path))
    if regenerated != text:
        diff = "".join(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                regenerated.splitlines(keepends=True),
                name,
                f"{name} from the code",
            )
        )
        pytest.fail(
            f"{name} differs from what the code prints: run `{REGENERATE}`\n{diff}",
            pytrace=False,
        )


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p in commands()])
def test_every_command_is_in_the_reference(path: tuple[str, ...]) -> None:
    reference = (DOCS / "reference.md").read_text(encoding="utf-8")
    heading = "#" * (len(path) + 1) + f" `pgqctl {' '.join(path)}`"
    assert re.search(f"^{re.escape(heading)}$", reference, re.M), (
        f"docs/reference.md has no `{heading}`: run `{REGENERATE}`"
    )


@pytest.mark.parametrize("name", top_level_commands())
def test_every_command_has_its_page_linked_from_the_readme(name: str) -> None:
    page = DOCS / "commands" / f"{name}.md"
    assert page.is_file(), (
        f"docs/commands/{name}.md is missing: add a page that says what `pgqctl {name}` "
        f"does, with examples, and list it in mkdocs.yml, docs/commands/index.md and README.md"
    )
    text = page.read_text(encoding="utf-8")
    assert text.startswith(f"# `pgqctl {name}"), (
        f"docs/commands/{name}.md: title it `pgqctl {name}`"
    )
    assert f"](../reference.md#pgqctl-{name})" in text, (
        f"docs/commands/{name}.md does not link to its --help: ../reference.md#pgqctl-{name}"
    )
    index = (DOCS / "commands" / "index.md").read_text(encoding="utf-8")
    assert f"]({name}.md)" in index, f"docs/commands/index.md does not list {name}.md"
    readme = README.read_text(encoding="utf-8")
    assert f"](docs/commands/{name}.md)" in readme, (
        f"README.md has no line linking to docs/commands/{name}.md"
    )


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p in commands()])
def test_every_command_help_has_an_example(path: tuple[str, ...]) -> None:
    command = "pgqctl " + " ".join(path)
    example = re.search(r"^  Examples?:\n((?: {4,}\S.*\n)+)", help_text(path), re.M)
    assert example, f"`{command} --help` has no Example: block"
    assert command in example.group(1), f"the example of `{command} --help` does not run it"


def test_help_is_the_same_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    clean = {path: help_text(path) for path in commands()}
    settings = {
        "PGQCTL_DSN": "postgresql://alice:s3cret@db.example:5432/jobs",
        "DATABASE_URL": "postgresql://bob:hunter2@db.example/jobs",
        "PGPASSWORD": "hunter3",
        "PGQCTL_SCHEMA": "jobs_staging",
        "PGQCTL_QUEUE": "emails",
        "PGQCTL_FORMAT": "json",
        "PGQCTL_LEASE": "9m",
        "PGQCTL_CONCURRENCY": "64",
        "COLUMNS": "40",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for path in commands():
        assert help_text(path) == clean[path], f"pgqctl {' '.join(path)} --help"
