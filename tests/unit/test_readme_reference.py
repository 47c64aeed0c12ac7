"""The README's command reference is what each command's --help prints."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from cogapp import Cog

from tests.readme_help import commands, help_text

README = Path(__file__).resolve().parents[2] / "README.md"
REGENERATE = ".venv/bin/cog -r README.md"

# A cog block (code on its one marker line) and the output cog wrote under it.
GENERATED = re.compile(
    r"^<!-- \[\[\[cog .*?\]\]\] -->\n(.*?)^<!-- \[\[\[end\]\]\] -->", re.M | re.S
)
SHOWN = re.compile(r"<summary><code>pgqctl (.+?) --help</code></summary>")


def command_params() -> list[object]:
    return [pytest.param(path, id=" ".join(path)) for path in commands()]


def command_sections() -> dict[str, str]:
    """The `### pgqctl NAME ...` subsections of the README's Commands section, by NAME."""
    text = README.read_text(encoding="utf-8")
    chapter = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    sections = {}
    for section in re.split(r"^### ", chapter, flags=re.M)[1:]:
        heading = re.match(r"`pgqctl (\S+?)[`\s]", section)
        if heading:
            sections[heading.group(1)] = section
    return sections


def test_the_readme_reference_is_what_the_code_prints() -> None:
    text = README.read_text(encoding="utf-8")
    regenerated = Cog().process_string(text, fname=str(README))
    if regenerated != text:
        diff = "".join(
            difflib.unified_diff(
                text.splitlines(keepends=True),
                regenerated.splitlines(keepends=True),
                "README.md",
                "README.md from --help",
            )
        )
        pytest.fail(
            f"README.md's command reference differs from --help: run `{REGENERATE}`\n{diff}",
            pytrace=False,
        )


@pytest.mark.parametrize("path", [pytest.param(p, id=" ".join(p)) for p in commands()])
def test_every_command_has_its_reference_in_its_readme_section(path: tuple[str, ...]) -> None:
    command = " ".join(path)
    section = command_sections().get(path[0])
    assert section is not None, (
        f"README.md has no `### pgqctl {path[0]}` section under ## Commands: add one that "
        f"says what it does and ends with the line `<!-- [[[cog import tests.readme_help as ref; "
        f'cog.out(ref.reference("{path[0]}")) ]]] -->` and `<!-- [[[end]]] -->`, '
        f"then run `{REGENERATE}`"
    )
    shown = {name for block in GENERATED.findall(section) for name in SHOWN.findall(block)}
    assert command in shown, (
        f"the README's `pgqctl {path[0]}` section has no generated `pgqctl {command} --help`: "
        f'end it with a cog block calling ref.reference("{path[0]}"), then run `{REGENERATE}`'
    )


@pytest.mark.parametrize("path", command_params())
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
