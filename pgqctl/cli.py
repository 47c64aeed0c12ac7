"""The command line: the `pgqctl` group, its global options, and the one
error boundary (`main`).

The commands live in pgqctl/commands/, one module per family; nothing below
this module and the commands prints.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import click
import psycopg
from click.core import ParameterSource

# Modules that only some commands use (the worker, migrations, the embedded
# server) are imported inside those commands: every command pays for what is
# imported here, and in a short command that is a good part of its run.
from pgqctl import __version__, db
from pgqctl.commands import (
    admin,
    control,
    doctor,
    embedded,
    enqueue,
    migrate,
    monitor,
    schedule,
    worker,
)
from pgqctl.commands.options import CONTEXT, DEBUG_HELP, OnceGroup, global_options, say
from pgqctl.errors import EXIT_FAILURE, EXIT_USAGE, DatabaseUnavailable, PgqctlError


@click.group(cls=OnceGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="pgqctl")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
@global_options
def cli(debug: bool, **options: Any) -> None:
    """Run and administer a job queue stored in one PostgreSQL table.

    --dsn, --schema, --format, --json, --lock-timeout and
    --statement-timeout may come before the command, as --debug may:
    `pgqctl --schema staging list` is `pgqctl list --schema staging`.

    \b
    Example:
        pgqctl migrate
        pgqctl enqueue report '{"argv": ["echo", "hello"]}'
        pgqctl worker --burst
        pgqctl --format json stats
    """


for _command in (
    migrate.migrate_command,
    enqueue.enqueue_command,
    embedded.embedded_group,
    admin.stats_command,
    admin.leases_command,
    admin.list_command,
    admin.show_command,
    admin.reap_command,
    admin.requeue_command,
    admin.cancel_command,
    admin.purge_command,
    monitor.workers_command,
    monitor.check_command,
    monitor.metrics_command,
    doctor.doctor_command,
    monitor.top_command,
    control.pause_command,
    control.resume_command,
    schedule.schedule_group,
    worker.worker_command,
):
    cli.add_command(_command)


def name_envvars(cmd: click.Command) -> None:
    """Let every option of `cmd` and its subcommands read PGQCTL_<OPTION>.

    The variable is named after the flag users type (--format: PGQCTL_FORMAT),
    not after the Python parameter (`fmt`), and not per command, so one
    PGQCTL_SCHEMA serves every command.
    """
    for option in all_options(cmd):
        if option.allow_from_autoenv and not option.envvar:
            flag = max(option.opts, key=len)
            option.envvar = "PGQCTL_" + flag.lstrip("-").replace("-", "_").upper()


def all_options(cmd: click.Command) -> Iterator[click.Option]:
    """Every option of `cmd` and of its subcommands, at any depth."""
    for param in cmd.params:
        if isinstance(param, click.Option):
            yield param
    for sub in getattr(cmd, "commands", {}).values():
        yield from all_options(sub)


# Once every command exists: each option reads PGQCTL_<OPTION>.
name_envvars(cli)


# --- the error boundary ------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn every expected failure into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("PGQCTL_DEBUG", "") not in ("", "0")
    args, undecodable = _as_utf8(args, os.environb)
    if undecodable:
        say(f"error: {undecodable} is not valid UTF-8: give names, payloads and DSNs as UTF-8 text")
        return EXIT_USAGE
    try:
        result = cli.main(args=args, prog_name="pgqctl", standalone_mode=False)
        # Here, not at exit: a full disk must end in one line and exit 1.
        sys.stdout.flush()
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.NoArgsIsHelpError as exc:  # `pgqctl` alone: its help
        click.echo(exc.format_message(), err=True)
        return exc.exit_code
    except click.UsageError as exc:
        # One line, like every other error, with where to look next.
        where = exc.ctx.command_path if exc.ctx else "pgqctl"
        message = exc.format_message().rstrip(".") + _from_environment(exc)
        say(f"error: {message}; see `{where} --help`")
        return exc.exit_code
    except click.ClickException as exc:
        say(f"error: {exc.format_message()}")
        return exc.exit_code
    except click.exceptions.Abort:
        say("aborted")
        return 130
    except PgqctlError as exc:
        return _report(exc, exc.exit_code, debug)
    except psycopg.OperationalError as exc:
        if _connection_lost(exc):
            return _report(
                DatabaseUnavailable(f"lost the database connection: {db.reason(exc)}"),
                EXIT_FAILURE,
                debug,
            )
        return _report(PgqctlError(f"database error: {db.reason(exc)}"), EXIT_FAILURE, debug)
    except psycopg.Error as exc:
        return _report(PgqctlError(f"database error: {db.reason(exc)}"), EXIT_FAILURE, debug)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (`pgqctl list | head`): not an error.
        _silence_stdout()
        return 0
    except OSError as exc:  # writing the output (a full disk), or a file named by an option
        if debug:
            traceback.print_exc()
        what = exc.filename if exc.filename else "writing the output"
        say(f"error: {what}: {exc.strerror or exc}")
        _silence_stdout()
        return EXIT_FAILURE


# Values pgqctl only hands to the system (a file to read, a command to run),
# where any bytes will do.
_BYTES_OPTIONS = ("--file", "--handler")
_BYTES_VARIABLES = ("PGQCTL_FILE", "PGQCTL_HANDLER")


def _as_utf8(args: list[str], environ: Mapping[bytes, bytes]) -> tuple[list[str], str | None]:
    """The arguments as UTF-8 text, and the first argument or variable of
    ours that is not UTF-8 (named, never shown: it may be a password), or None.

    Python decodes arguments by the locale, and keeps bytes it cannot decode
    as lone surrogates, which no query can carry; from the bytes themselves,
    UTF-8 text reads right whatever the locale says.
    """
    text = []
    for i, arg in enumerate(args):
        option, _, _ = arg.partition("=")
        if option in _BYTES_OPTIONS or (i and args[i - 1] in _BYTES_OPTIONS):
            text.append(arg)
            continue
        decoded = _utf8(os.fsencode(arg))
        if decoded is None:
            if arg.startswith("--"):
                return args, f"the value of {option}"
            after = f" (after {args[i - 1]})" if i and args[i - 1].startswith("-") else ""
            return args, f"argument {i + 1}{after}"
        text.append(decoded)
    read = {o.envvar for o in all_options(cli) if isinstance(o.envvar, str)}
    for name in sorted((read | {"PGQCTL_DSN", "DATABASE_URL"}) - set(_BYTES_VARIABLES)):
        value = environ.get(name.encode())
        if value is not None and _utf8(value) is None:
            return args, name
    return text, None


def _utf8(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _from_environment(exc: click.UsageError) -> str:
    """' (from PGQCTL_X)' when the bad value came from that variable, not the command line."""
    param = getattr(exc, "param", None)
    if param is None or exc.ctx is None or not param.name or not isinstance(param.envvar, str):
        return ""
    source = exc.ctx.get_parameter_source(param.name)
    return f" (from {param.envvar})" if source == ParameterSource.ENVIRONMENT else ""


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    """Whether the error is the connection going away, not one the server
    reported on a statement (a value too large, a statement timeout...),
    which psycopg files under the same class."""
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _report(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    say(f"error: {exc}")
    return code


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
