"""`pgqctl --help` and `--version` load no command: what they import, and
the summaries that list the commands without loading them.

Start-up time itself is measured by bench/startup_bench.py, never here:
these tests look at module names only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from pgqctl.cli import COMMANDS, all_options, cli
from pgqctl.commands.lazy import LazyGroup, summary_of

ROOT = Path(__file__).resolve().parents[2]

# What the group needs to parse its options and print its help. The package
# itself brings its public API (pgqctl.intake, pgqctl.completion) and what
# they import.
NEEDED_FOR_HELP = {
    "pgqctl",
    "pgqctl.__main__",
    "pgqctl.cli",
    "pgqctl.commands",
    "pgqctl.commands.lazy",
    "pgqctl.commands.options",
    "pgqctl.completion",
    "pgqctl.durations",
    "pgqctl.errors",
    "pgqctl.intake",
    "pgqctl.intake.api",
    "pgqctl.intake.copy_rows",
    "pgqctl.intake.fanout",
    "pgqctl.intake.fields",
    "pgqctl.intake.lines",
    "pgqctl.intake.loading",
    "pgqctl.intake.statements",
    "pgqctl.intake.unique",
    "pgqctl.formats",
    "pgqctl.limits",
    "pgqctl.sql",
}
# Libraries only commands use: named, so a failure says which one came back.
NOT_FOR_HELP = ("psycopg", "psycopg_binary", "rich", "tabulate", "prometheus_client", "cronsim")


def imported(*args: str) -> set[str]:
    """The modules `python -X importtime -m pgqctl ARGS` imports (this checkout's)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pgqctl", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert lines, done.stderr
    # "import time: self [us] | cumulative | imported package", indented by depth.
    return {line.rsplit("|", 1)[1].strip() for line in lines[1:]}


@pytest.mark.parametrize("args", [("--help",), ("--version",), ()], ids=["help", "version", "bare"])
def test_help_and_version_import_no_command(args: tuple[str, ...]) -> None:
    modules = imported(*args)
    run = " ".join(("pgqctl", *args))
    assert "pgqctl.cli" in modules  # the run did reach the CLI
    libraries = sorted(m for m in modules if m.split(".")[0] in NOT_FOR_HELP)
    assert not libraries, f"`{run}` imports {libraries}"
    ours = sorted(m for m in modules if m.split(".")[0] == "pgqctl")
    extra = sorted(set(ours) - NEEDED_FOR_HELP)
    assert not extra, (
        f"`{run}` imports {extra}: import them inside the command or function that uses them"
    )


def test_a_command_loads_its_own_module_and_no_other() -> None:
    modules = imported("stats", "--help")
    assert "pgqctl.commands.admin" in modules
    others = {"pgqctl.commands.worker", "pgqctl.commands.doctor", "pgqctl.commands.schedule"}
    assert not others & modules
    assert not {"pgqctl.worker", "pgqctl.doctor", "pgqctl.schedules", "rich"} & modules


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_summary_is_the_command_s_own(name: str) -> None:
    command = cli.commands[name]
    assert command.name == name, f"{COMMANDS[name].target} is the command {command.name!r}"
    assert COMMANDS[name].summary == summary_of(command), (
        f"COMMANDS[{name!r}] in pgqctl/cli.py differs from the first paragraph of the "
        f"command's help: make its summary {summary_of(command)!r}"
    )


@pytest.mark.parametrize("width", [40, 80, 100, 200])
def test_the_commands_are_listed_as_click_lists_them_loaded(width: int) -> None:
    def listing(group: click.Group) -> str:
        ctx = click.Context(
            group, info_name="pgqctl", terminal_width=width, max_content_width=width
        )
        formatter = ctx.make_formatter()
        group.format_commands(ctx, formatter)
        return formatter.getvalue()

    # A group of its own: `cli`'s commands are loaded by the other tests.
    unloaded = LazyGroup("pgqctl", lazy=COMMANDS, prepare=lambda command: None)
    loaded = click.Group("pgqctl", commands={name: cli.commands[name] for name in COMMANDS})
    assert listing(unloaded) == listing(loaded)
    assert all(unloaded.commands.loaded(name) is None for name in COMMANDS)


def test_every_variable_pgqctl_reads_starts_with_pgqctl_() -> None:
    # `cli.main` looks for text that is not UTF-8 in these variables only,
    # so as not to import every command to learn their names.
    read = {o.envvar for o in all_options(cli) if o.envvar}
    assert read and all(isinstance(v, str) and v.startswith("PGQCTL_") for v in read), read
