"""The command line: one short function per command, one error boundary.

Commands parse and validate input, call the library, and hand results to
`output`. Nothing below this module prints.
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import psycopg

from pgqctl import __version__, config, db, embedded, output
from pgqctl import migrate as migrations
from pgqctl.durations import parse_duration
from pgqctl.errors import (
    EXIT_FAILURE,
    BadInput,
    CheckFailed,
    DatabaseUnavailable,
    PgqctlError,
)
from pgqctl.worker import CONNECTION_PARAMS, Worker, WorkerConfig, prepare_session
from pgqctl.worklog import LOG_FORMATS, WorkLog

F = TypeVar("F", bound=Callable[..., Any])

# Every option also reads PGQCTL_<OPTION> from the environment.
CONTEXT = {"auto_envvar_prefix": "PGQCTL", "help_option_names": ["-h", "--help"]}


def say(message: str) -> None:
    """A message for the person at the terminal: always stderr."""
    click.echo(f"pgqctl: {message}", err=True)


@dataclass
class Database:
    """Where this invocation connects; the connection is opened on demand."""

    dsn_option: str | None
    schema: str

    def dsn(self) -> str:
        target = config.resolve_target(self.dsn_option, os.environ)
        if target.dsn is not None:
            return target.dsn
        started = embedded.ensure_running()
        if started.started:
            what = "created and started" if started.created else "started"
            say(
                f"no database configured: {what} the embedded PostgreSQL in "
                f"{started.data_dir}; it keeps running (`pgqctl embedded stop` stops it). "
                "Set PGQCTL_DSN or --dsn to use your own database."
            )
        return started.dsn

    def connect(self, *, migrated: bool = True, application_name: str = db.APPLICATION_NAME) -> Any:
        conn = db.connect(self.dsn(), schema=self.schema, application_name=application_name)
        if migrated:
            try:
                db.require_migrated(conn, self.schema)
            except BaseException:
                conn.close()
                raise
        return conn


def database_options(func: F) -> F:
    """--dsn and --schema, for every command that talks to the queue."""

    @click.option(
        "--dsn",
        metavar="DSN",
        envvar=None,
        help="PostgreSQL URL or conninfo (else PGQCTL_DSN, DATABASE_URL, PG* variables, "
        "then the embedded server).",
    )
    @click.option(
        "--schema",
        default="public",
        show_default=True,
        help="Schema holding the jobs table.",
    )
    @functools.wraps(func)
    def wrapper(*args: Any, dsn: str | None, schema: str, **kwargs: Any) -> Any:
        return func(*args, database=Database(dsn, schema), **kwargs)

    return wrapper  # type: ignore[return-value]


def format_options(func: F) -> F:
    """--format and its --json shorthand, for every listing."""

    @click.option(
        "--format",
        "fmt",
        type=click.Choice(output.FORMATS),
        default="auto",
        show_default=True,
        help="auto: a table on a terminal, plain when piped.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Shorthand for --format json.")
    @functools.wraps(func)
    def wrapper(*args: Any, fmt: str, as_json: bool, **kwargs: Any) -> Any:
        return func(*args, fmt="json" if as_json else fmt, **kwargs)

    return wrapper  # type: ignore[return-value]


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="pgqctl")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
def cli(debug: bool) -> None:
    """Run and administer a job queue stored in one PostgreSQL table.

    \b
    Example:
        pgqctl migrate
        pgqctl enqueue report '{"argv": ["echo", "hello"]}'
        pgqctl worker --burst
    """


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """`30s`, `5m`, `2h`, `1d` or seconds, as a float number of seconds."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(
                str(value), what=param.get_error_hint(ctx) if param and ctx else "duration"
            )
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()


def command(name: str | None = None, **kwargs: Any) -> Callable[[F], F]:
    """A subcommand whose options read PGQCTL_<OPTION>, not PGQCTL_<CMD>_<OPTION>."""
    return cli.command(name, context_settings=CONTEXT, **kwargs)  # type: ignore[return-value]


# --- migrate -----------------------------------------------------------------


@command("migrate")
@database_options
@click.option("--dry-run", is_flag=True, help="List what would be applied; change nothing.")
@click.option("--check", is_flag=True, help="Exit 3 if any migration is pending, else 0.")
@click.option("--status", "show_status", is_flag=True, help="List applied and pending migrations.")
@format_options
def migrate_command(
    database: Database, dry_run: bool, check: bool, show_status: bool, fmt: str
) -> None:
    """Create or upgrade the queue schema.

    Each migration runs in its own transaction under an advisory lock, so
    concurrent runs are safe; re-running is a no-op.

    \b
    Example:
        pgqctl migrate
        pgqctl migrate --check || echo "schema out of date"
        pgqctl --debug migrate --schema jobs_staging --status
    """
    with database.connect(migrated=False) as conn:
        if show_status:
            states = migrations.status(conn, database.schema)
            rows = [
                {"name": s.name, "status": s.status, "applied_at": s.applied_at} for s in states
            ]
            output.emit_rows(rows, ["name", "status", "applied_at"], fmt)
            return
        todo = migrations.pending(conn, database.schema)
        if check:
            if todo:
                raise CheckFailed(
                    f"{len(todo)} migration(s) pending in schema {database.schema}: "
                    "run `pgqctl migrate`"
                )
            say(f"schema {database.schema} is up to date")
            return
        if dry_run:
            for m in todo:
                click.echo(m.name)
            say(f"{len(todo)} migration(s) would be applied" if todo else "nothing to do")
            return
        applied = migrations.apply(
            conn, database.schema, on_applied=lambda m: say(f"applied {m.name}")
        )
        if not applied:
            say(f"nothing to do: schema {database.schema} is up to date")


# --- embedded ----------------------------------------------------------------


@cli.group("embedded", context_settings=CONTEXT)
def embedded_group() -> None:
    """Manage the embedded PostgreSQL used when no database is configured.

    \b
    Example:
        pgqctl embedded status
        psql "$(pgqctl embedded dsn)"
        pgqctl embedded stop
    """


@embedded_group.command("status", context_settings=CONTEXT)
@format_options
def embedded_status(fmt: str) -> None:
    """Show whether the embedded PostgreSQL exists and runs."""
    st = embedded.status()
    row = {
        "data_dir": str(st.data_dir),
        "initialized": st.initialized,
        "running": st.running,
        "pid": st.pid,
        "version": st.version,
        "dsn": st.dsn,
    }
    if output.resolve_format(fmt) in output.HUMAN_FORMATS:
        output.emit_rows(
            [{"field": k, "value": v} for k, v in row.items()], ["field", "value"], fmt
        )
    elif output.resolve_format(fmt) == "json":
        output.emit_object(row)
    else:
        output.emit_rows([row], list(row), fmt)


@embedded_group.command("stop", context_settings=CONTEXT)
def embedded_stop() -> None:
    """Stop the embedded PostgreSQL (its data is kept)."""
    if embedded.stop():
        say("stopped the embedded PostgreSQL")
    else:
        say("the embedded PostgreSQL was not running")


@embedded_group.command("dsn", context_settings=CONTEXT)
def embedded_dsn() -> None:
    """Print the embedded server's connection string, starting it if needed.

    \b
    Example:
        export PGQCTL_DSN="$(pgqctl embedded dsn)"
    """
    click.echo(embedded.ensure_running().dsn)


# --- worker ------------------------------------------------------------------

WORKER_APPLICATION_NAME = "pgqctl worker"


class HandlerSpec(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """`KIND=COMMAND`, COMMAND split like a shell would (no shell runs it)."""

    name = "handler"
    # PGQCTL_HANDLER holds one handler per line: commands contain spaces.
    envvar_list_splitter = "\n"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, tuple[str, ...]]:
        if isinstance(value, tuple):
            return value
        kind, sep, command = str(value).partition("=")
        example = "e.g. --handler 'resize=convert-image --quality 80'"
        if not sep or not kind.strip() or not command.strip():
            self.fail(f"{value!r} is not KIND=COMMAND, {example}", param, ctx)
        try:
            argv = tuple(shlex.split(command))
        except ValueError as exc:
            self.fail(f"cannot split the command of {value!r}: {exc}, {example}", param, ctx)
        return kind.strip(), argv


@command("worker")
@database_options
@click.option(
    "--queue",
    "queues",
    multiple=True,
    envvar="PGQCTL_QUEUE",
    metavar="QUEUE",
    help="Claim only jobs of this queue (repeatable; default: every queue).",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    envvar="PGQCTL_KIND",
    metavar="KIND",
    help="Claim only jobs of this kind (repeatable; default: every kind).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default="the number of CPUs",
    help="Jobs run at the same time.",
)
@click.option(
    "--lease",
    type=DURATION,
    default="5m",
    show_default=True,
    help="How long a claim holds a job; renewed every third of it while the job runs.",
)
@click.option(
    "--poll",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Look for jobs this often even without a notification.",
)
@click.option(
    "--timeout",
    type=DURATION,
    default=None,
    help="Stop jobs that run longer (a payload's own timeout wins). Default: no limit.",
)
@click.option(
    "--grace",
    type=DURATION,
    default="30s",
    show_default=True,
    help="On SIGTERM/SIGINT, how long running jobs may finish before they are stopped.",
)
@click.option(
    "--backoff",
    type=DURATION,
    default="2s",
    show_default=True,
    help="Retry delay after a first failure; doubles with each attempt (±25%, at most 1h).",
)
@click.option("--burst", is_flag=True, help="Exit once no job is due and none is running.")
@click.option(
    "--max-jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Exit after claiming this many jobs (once they finish).",
)
@click.option("--allow-shell", is_flag=True, help='Run {"shell": "..."} payloads with /bin/sh.')
@click.option(
    "--handler",
    "handlers",
    type=HandlerSpec(),
    multiple=True,
    envvar="PGQCTL_HANDLER",
    metavar="KIND=COMMAND",
    help="Run COMMAND for jobs of KIND, with the payload as JSON on stdin (repeatable).",
)
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines on stderr: text, or one JSON object per line.",
)
def worker_command(
    database: Database,
    queues: tuple[str, ...],
    kinds: tuple[str, ...],
    concurrency: int,
    lease: float,
    poll: float,
    timeout: float | None,
    grace: float,
    backoff: float,
    burst: bool,
    max_jobs: int | None,
    allow_shell: bool,
    handlers: tuple[tuple[str, tuple[str, ...]], ...],
    log_format: str,
) -> int:
    """Run jobs: claim them, run each as a child process, record how it ended.

    A payload {"argv": [...]} runs that program directly; {"shell": "..."}
    needs --allow-shell; with --handler KIND=COMMAND, jobs of KIND run
    COMMAND with their payload as JSON on stdin. Exit 0: done; anything
    else: retried with exponential backoff until max_attempts, then failed.
    The child gets PGQCTL_JOB_ID (an idempotency key), PGQCTL_JOB_KIND,
    PGQCTL_JOB_QUEUE and PGQCTL_JOB_ATTEMPT, and no database credentials.

    SIGTERM or SIGINT: claim nothing more, let running jobs finish for
    --grace, then stop them and hand them back; a second signal stops them
    at once. Logs one line per job event on stderr.

    \b
    Example:
        pgqctl worker --concurrency 8
        pgqctl worker --queue emails --handler 'send_receipt=bin/send-receipt' --burst
        pgqctl worker --kind report --timeout 10m --log-format json
    """
    if lease < 1:
        raise BadInput("--lease must be at least 1s (it is renewed every third of it)")
    if poll <= 0:
        raise BadInput("--poll must be more than 0s, e.g. --poll 5s")
    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be more than 0s; leave it out for no limit")
    handler_map: dict[str, tuple[str, ...]] = {}
    for kind, argv in handlers:
        if kind in handler_map:
            raise BadInput(f"--handler given twice for kind {kind!r}: keep one")
        handler_map[kind] = argv
    settings = WorkerConfig(
        schema=database.schema,
        queues=queues,
        kinds=kinds,
        concurrency=concurrency,
        lease=lease,
        poll=poll,
        timeout=timeout,
        grace=grace,
        burst=burst,
        max_jobs=max_jobs,
        allow_shell=allow_shell,
        handlers=handler_map,
        backoff=backoff,
    )
    # psycopg logs a lost connection inside a pipeline with Python's last-resort
    # handler (a bare stderr line); the worker logs that event itself.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())
    dsn = database.dsn()

    def connect() -> Any:
        conn = db.connect(
            dsn,
            schema=database.schema,
            application_name=WORKER_APPLICATION_NAME,
            **CONNECTION_PARAMS,
        )
        prepare_session(conn)
        return conn

    conn = connect()
    try:
        db.require_migrated(conn, database.schema)
    except BaseException:
        conn.close()
        raise
    root = click.get_current_context().find_root()
    log = WorkLog(sys.stderr, log_format, debug=bool(root.params.get("debug")))
    worker = Worker(settings, connect, log, describe_target=config.describe(dsn))
    return worker.run(conn)


# --- the error boundary ------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; turn every expected failure into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("PGQCTL_DEBUG", "") not in ("", "0")
    try:
        result = cli.main(args=args, prog_name="pgqctl", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.UsageError as exc:
        # One line, like every other error, with where to look next.
        where = exc.ctx.command_path if exc.ctx else "pgqctl"
        say(f"error: {exc.format_message().rstrip('.')}; see `{where} --help`")
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
        return _report(
            DatabaseUnavailable(f"lost the database connection: {db.reason(exc)}"),
            EXIT_FAILURE,
            debug,
        )
    except psycopg.Error as exc:
        return _report(PgqctlError(f"database error: {db.reason(exc)}"), EXIT_FAILURE, debug)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (`pgqctl list | head`): not an error.
        _silence_stdout()
        return 0


def _report(exc: BaseException, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    say(f"error: {exc}")
    return code


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
