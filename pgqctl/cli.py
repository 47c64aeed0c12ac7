"""The command line: the `pgqctl` group, its global options, and the one
error boundary (`main`).

The commands live in pgqctl/commands/, one module per family, each
imported only when its command runs; nothing below this module and the
commands prints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

# Only what `pgqctl --help` and `--version` need: each command's module is
# imported when that command runs (or shows its own --help), so that
# psycopg, rich and the library load only for the commands that use them.
from pgqctl import __version__
from pgqctl.commands.lazy import Lazy, LazyGroup
from pgqctl.commands.options import CONTEXT, DEBUG_HELP, global_options, say
from pgqctl.errors import EXIT_FAILURE, EXIT_USAGE, DatabaseUnavailable, PgqctlError

if TYPE_CHECKING:
    import psycopg

# Every command: where it is defined, and the first paragraph of its help,
# from which `pgqctl --help` makes its line without importing it
# (tests/unit/test_cli_startup.py holds each to the command's own help).
COMMANDS = {
    "migrate": Lazy(
        "pgqctl.commands.migrate:migrate_command",
        "Create or upgrade the queue schema.",
    ),
    "enqueue": Lazy(
        "pgqctl.commands.enqueue:enqueue_command",
        "Add a job (KIND, with a JSON object PAYLOAD, default {}) and print its id.",
    ),
    "embedded": Lazy(
        "pgqctl.commands.embedded:embedded_group",
        "Manage the embedded PostgreSQL used when no database is configured.",
    ),
    "stats": Lazy(
        "pgqctl.commands.admin:stats_command",
        "Jobs per status, in total and per queue, with expired leases and the age of the "
        "oldest due pending job.",
    ),
    "leases": Lazy(
        "pgqctl.commands.admin:leases_command",
        "Running jobs: who holds each lease, when it ends, and the time left (negative when "
        "overdue), soonest end first.",
    ),
    "list": Lazy(
        "pgqctl.commands.admin:list_command",
        "Jobs, newest first, with why each failed (if it did).",
    ),
    "show": Lazy(
        "pgqctl.commands.admin:show_command",
        "One job, whole: every column, the payload pretty-printed, the full last error, and a "
        "timeline of its attempts.",
    ),
    "failures": Lazy(
        "pgqctl.commands.failures:failures_command",
        "Failed jobs grouped by kind and cause, the most frequent first.",
    ),
    "logs": Lazy(
        "pgqctl.commands.attempts:logs_command",
        "The output an attempt of a job wrote, as the worker kept it.",
    ),
    "why": Lazy(
        "pgqctl.commands.why:why_command",
        "Why a job is not running, each reason with the command that would change it.",
    ),
    "reap": Lazy(
        "pgqctl.commands.admin:reap_command",
        "Reclaim expired leases, and the jobs of dead workers: each job goes back to pending, "
        "or to failed when it has used all its attempts.",
    ),
    "requeue": Lazy(
        "pgqctl.commands.admin:requeue_command",
        "Move failed or cancelled jobs back to pending, or make pending jobs due now, all in "
        "one statement.",
    ),
    "cancel": Lazy(
        "pgqctl.commands.admin:cancel_command",
        "Cancel pending or running jobs: each ends cancelled, finished now, and is never "
        "claimed again (`requeue` brings it back).",
    ),
    "purge": Lazy(
        "pgqctl.commands.admin:purge_command",
        "Delete finished jobs, done by default, in batches of short transactions so workers "
        "never wait on more than one batch.",
    ),
    "workers": Lazy(
        "pgqctl.commands.monitor:workers_command",
        "The registered workers: whether each is alive, what it serves, and the jobs it holds now.",
    ),
    "check": Lazy(
        "pgqctl.commands.monitor:check_command",
        "Hold every queue to thresholds, for cron, Nagios-style monitors and probes: exit 0 "
        "when all hold, 3 when one does not, 1 when the queue cannot be read (a check that "
        "cannot check never says OK).",
    ),
    "metrics": Lazy(
        "pgqctl.commands.monitor:metrics_command",
        "The queue's figures in the Prometheus text exposition format: to stdout, to a file, "
        "or served over HTTP.",
    ),
    "doctor": Lazy(
        "pgqctl.commands.doctor:doctor_command",
        "Why the queue is slow: vacuum, bloat and the xmin horizon of the queue's tables, "
        "with what to do and the SQL that does it.",
    ),
    "top": Lazy(
        "pgqctl.commands.monitor:top_command",
        "A live view of the queue on the whole terminal, refreshed in place: per queue the "
        "pending and running jobs, the jobs done and failed per second since the last "
        "refresh, the oldest due job's wait and when any pause ends; the running jobs whose "
        "leases end soonest; the registered workers, active or stale; per kind, the run time "
        "percentiles of the last minute's attempts. Each row stays on one line: on a narrow "
        "terminal, names are cut with ….",
    ),
    "pause": Lazy(
        "pgqctl.commands.control:pause_command",
        "Stop workers claiming jobs from these queues, until resumed or for a while.",
    ),
    "resume": Lazy(
        "pgqctl.commands.control:resume_command",
        "Let workers claim from paused queues again, at once.",
    ),
    "actions": Lazy(
        "pgqctl.commands.actions:actions_command",
        "What operators did to the queue from the web page: when, who, what, on which jobs, "
        "and how many.",
    ),
    "limit": Lazy(
        "pgqctl.commands.limit:limit_group",
        "Fleet-wide limits on a queue or a kind: jobs running at once, started per period, "
        "running per key.",
    ),
    "schedule": Lazy(
        "pgqctl.commands.schedule:schedule_group",
        "Cron and interval schedules, enqueued by the running workers: one job per tick.",
    ),
    "web": Lazy(
        "pgqctl.commands.web:web_command",
        "Serve the queue in a browser: an overview updated live, jobs, a job's attempts and "
        "why it waits, workers, schedules, doctor.",
    ),
    "worker": Lazy(
        "pgqctl.commands.worker:worker_command",
        "Run jobs: claim them, run each as a child process, record how it ended.",
    ),
}


def name_envvars(cmd: click.Command) -> None:
    """Let every option of `cmd` and its subcommands read PGQCTL_<OPTION>."""
    name_option_envvars(all_options(cmd))


def name_option_envvars(params: Iterable[click.Parameter]) -> None:
    """Let each option read PGQCTL_<OPTION>.

    The variable is named after the flag users type (--format: PGQCTL_FORMAT),
    not after the Python parameter (`fmt`), and not per command, so one
    PGQCTL_SCHEMA serves every command.
    """
    for option in params:
        if isinstance(option, click.Option) and option.allow_from_autoenv and not option.envvar:
            flag = max(option.opts, key=len)
            option.envvar = "PGQCTL_" + flag.lstrip("-").replace("-", "_").upper()


def all_options(cmd: click.Command) -> Iterator[click.Option]:
    """Every option of `cmd` and of its subcommands, at any depth (of a
    `pgqctl` group, this imports every command)."""
    for param in cmd.params:
        if isinstance(param, click.Option):
            yield param
    for sub in getattr(cmd, "commands", {}).values():
        yield from all_options(sub)


# Each command's options read PGQCTL_<OPTION> from when it is loaded.
@click.group(cls=LazyGroup, context_settings=CONTEXT, lazy=COMMANDS, prepare=name_envvars)
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


# The group's own options (--debug reads PGQCTL_DEBUG), without loading its commands.
name_option_envvars(cli.params)


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
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (`pgqctl list | head`): not an error.
        _silence_stdout()
        return 0
    except OSError as exc:  # writing the output (a full disk), or a file named by an option
        if debug:
            _print_traceback()
        what = exc.filename if exc.filename else "writing the output"
        say(f"error: {what}: {exc.strerror or exc}")
        _silence_stdout()
        return EXIT_FAILURE
    except Exception as exc:
        meant = _database_error(exc)
        if meant is None:
            raise
        return _report(meant, EXIT_FAILURE, debug)


def _database_error(exc: Exception) -> PgqctlError | None:
    """What a psycopg error means for the user; None for any other exception.

    psycopg is looked up, not imported: a command that did not load it
    cannot have raised its errors, and --help must not pay for it.
    """
    psycopg = sys.modules.get("psycopg")
    if psycopg is None or not isinstance(exc, psycopg.Error):
        return None
    from pgqctl import db

    if isinstance(exc, psycopg.OperationalError) and _connection_lost(exc):
        return DatabaseUnavailable(f"lost the database connection: {db.reason(exc)}")
    return PgqctlError(f"database error: {db.reason(exc)}")


# Values pgqctl only hands to the system (a file to read, a command to run),
# where any bytes will do.
_BYTES_OPTIONS = ("--file", "--handler")
_BYTES_VARIABLES = ("PGQCTL_FILE", "PGQCTL_HANDLER")
_OUR_PREFIX = b"PGQCTL_"


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
    # Every variable pgqctl reads is named PGQCTL_* (or is DATABASE_URL); which
    # ones its options read is known only once every command is imported, so
    # that is done only when one of them is not UTF-8.
    suspects = {
        key
        for key, value in environ.items()
        if (key.startswith(_OUR_PREFIX) or key == b"DATABASE_URL") and _utf8(value) is None
    }
    if not suspects:
        return text, None
    read = {o.envvar for o in all_options(cli) if isinstance(o.envvar, str)}
    for name in sorted((read | {"PGQCTL_DSN", "DATABASE_URL"}) - set(_BYTES_VARIABLES)):
        if name.encode() in suspects:
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
        _print_traceback()
    say(f"error: {exc}")
    return code


def _print_traceback() -> None:
    import traceback  # only --debug shows one

    traceback.print_exc()


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
