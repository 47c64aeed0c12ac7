"""The docs' command reference, made from each command's own --help.

docs/reference.md calls `reference_page()` from a cog marker, and docs/table.md
calls `statuses_table()`; `.venv/bin/cog -r docs/*.md` rewrites those blocks,
and tests/unit/test_docs_reference.py fails while they differ from the code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
from click.testing import CliRunner

# The reference describes this checkout's pgqctl, even when cog runs from a
# virtualenv with a regular (not editable) install of an older copy.
ROOT = str(Path(__file__).resolve().parents[2])
if sys.path[:1] != [ROOT]:
    sys.path.insert(0, ROOT)

from pgqctl.cli import cli  # noqa: E402

# What an 80-column terminal shows: the same wrapping wherever it is rendered.
WIDTH = 80


def commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command a user runs, as its names after `pgqctl`, in the group's
    order; a group stands for its subcommands (`embedded` for `embedded stop`...)."""
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += commands(command, (*path, name))
        else:
            found.append((*path, name))
    return found


def help_text(path: tuple[str, ...]) -> str:
    """What `pgqctl <path> --help` prints, the same on every machine.

    The user's settings (PGQCTL_*, DATABASE_URL, libpq's PG*, COLUMNS) are
    removed so that no value of theirs, a DSN with its password least of all,
    can end up in the docs.
    """
    settings = ("PGQCTL_", "PG", "DATABASE_URL", "COLUMNS", "LINES")
    env: dict[str, str | None] = {name: None for name in os.environ if name.startswith(settings)}
    result = CliRunner().invoke(
        cli,
        [*path, "--help"],
        prog_name="pgqctl",
        env=env,
        color=False,
        terminal_width=WIDTH,
        max_content_width=WIDTH,
    )
    if result.exit_code != 0:
        raise RuntimeError(f"pgqctl {' '.join(path)} --help failed: {result.output}")
    return result.output


def reference_page() -> str:
    """Every command's --help, one section per command in the group's order
    (a group's subcommands one level down), each titled `pgqctl NAME` so that
    a page links to it as reference.md#pgqctl-NAME."""
    parts: list[str] = []
    for name in dict.fromkeys(path[0] for path in commands()):
        paths = [path for path in commands() if path[0] == name]
        parts.append(f"## `pgqctl {name}`\n")
        if paths == [(name,)]:
            parts.append(_block(paths[0]))
            continue
        for path in paths:
            parts.append(f"### `pgqctl {' '.join(path)}`\n")
            parts.append(_block(path))
    return "\n".join(parts)


def _block(path: tuple[str, ...]) -> str:
    text = help_text(path)
    if "```" in text:  # it would end the fence early
        raise ValueError(f"pgqctl {' '.join(path)} --help contains ```")
    return f"```text\n{text}```\n"


def statuses_table() -> str:
    """The table of statuses in docs/table.md, from the one list the code uses."""
    from pgqctl.jobs import STATUSES

    lines = ["| status | means | leaves it | to | when |", "| --- | --- | --- | --- | --- |"]
    for status in STATUSES:
        for i, move in enumerate(status.moves):
            name, meaning = (f"`{status.name}`", status.meaning) if i == 0 else ("", "")
            to = move.to if move.to == "deleted" else f"`{move.to}`"
            lines.append(f"| {name} | {meaning} | {move.by} | {to} | {move.when} |")
    return "\n".join(lines) + "\n"
