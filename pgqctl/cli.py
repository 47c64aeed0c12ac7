"""The command line: one short function per command, one error boundary.

Commands parse and validate input, call the library, and hand results to
`output`. Nothing below this module prints.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import itertools
import json
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click
import psycopg
from click.core import ParameterSource

# Modules that only some commands use (the worker, migrations, the embedded
# server) are imported inside those commands: every command pays for what is
# imported here, and in a short command that is a good part of its run.
from pgqctl import __version__, config, db, output, queue
from pgqctl.durations import parse_duration
from pgqctl.enqueue import (
    insert_jobs,
    insert_rows,
    make_job,
    parse_payload,
    parse_run_at,
    read_rows,
)
from pgqctl.errors import (
    EXIT_FAILURE,
    EXIT_USAGE,
    BadInput,
    CheckFailed,
    DatabaseUnavailable,
    NotFound,
    PgqctlError,
)
from pgqctl.worklog import LOG_FORMATS  # small; the worker command's options need it

if TYPE_CHECKING:  # imported by the commands that start it, not at start-up
    from pgqctl.embedded import EmbeddedStart

F = TypeVar("F", bound=Callable[..., Any])

# Every option also reads PGQCTL_<OPTION> from the environment.
CONTEXT = {"help_option_names": ["-h", "--help"]}


def say(message: str) -> None:
    """A message for the person at the terminal: always stderr."""
    click.echo(f"pgqctl: {message}", err=True)


def _started(started: EmbeddedStart) -> str:
    """What `embedded.ensure_running` did, for the person who did not ask for it."""
    what = "created and started" if started.created else "started"
    return (
        f"{what} the embedded PostgreSQL in {started.data_dir}; "
        "it keeps running (`pgqctl embedded stop` stops it)"
    )


class JobId(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A job id: a positive integer."""

    name = "id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = 0
        if number < 1 or number > 2**63 - 1:
            self.fail(f"a job id is a positive whole number, got {value!r}", param, ctx)
        return number


JOB_ID = JobId()


@dataclass
class Database:
    """Where this invocation connects; the connection is opened on demand."""

    dsn_option: str | None
    schema: str

    def dsn(self) -> str:
        target = config.resolve_target(self.dsn_option, os.environ)
        if target.dsn is not None:
            return target.dsn
        from pgqctl import embedded

        started = embedded.ensure_running()
        if started.started:
            say(
                f"no database configured: {_started(started)}. "
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


DEBUG_HELP = "Show tracebacks on errors."


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="pgqctl")
@click.option("--debug", is_flag=True, help=DEBUG_HELP)
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
            # Click's message already names the option.
            return parse_duration(str(value), what="value")
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
# A count the database stores or compares as a 32-bit integer.
COUNT = click.IntRange(min=1, max=2**31 - 1)


def selection_option(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that chooses what a command changes: never read from the environment.

    A PGQCTL_QUEUE meant for workers must not quietly narrow a `requeue`, and
    a stray PGQCTL_DRY_RUN must not turn a cron job into a no-op.
    """
    return click.option(*names, allow_from_autoenv=False, **kwargs)  # type: ignore[return-value]


def command(
    name: str | None = None, *, group: click.Group | None = None, **kwargs: Any
) -> Callable[[F], F]:
    """A subcommand (of `group`, default the top level) whose options read
    PGQCTL_<OPTION>, not PGQCTL_<CMD>_<OPTION>.

    Each also takes --debug, as people type it after the command too.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, debug: bool, **kw: Any) -> Any:
            return func(*args, **kw)  # `main` and `_debugging` see it

        parent = cli if group is None else group
        made = parent.command(name, context_settings=CONTEXT, **kwargs)(wrapper)
        made.params.append(click.Option(["--debug"], is_flag=True, help=DEBUG_HELP))
        return made  # type: ignore[return-value]

    return decorate


def _debugging() -> bool:
    """--debug (or PGQCTL_DEBUG), given before the command or after it."""
    ctx = click.get_current_context()
    return any(c.params.get("debug") for c in (ctx, ctx.find_root()))


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


# --- migrate -----------------------------------------------------------------


@command("migrate")
@database_options
@selection_option("--dry-run", is_flag=True, help="List what would be applied; change nothing.")
@selection_option("--check", is_flag=True, help="Exit 3 if any migration is pending, else 0.")
@selection_option(
    "--status", "show_status", is_flag=True, help="List applied and pending migrations."
)
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
    from pgqctl import migrate as migrations

    with database.connect(migrated=False) as conn:
        if show_status:
            states = migrations.status(conn, database.schema)
            rows = [
                {"name": s.name, "status": s.status, "applied_at": s.applied_at} for s in states
            ]
            output.emit_rows(rows, ["name", "status", "applied_at"], fmt)
            return
        if check:
            todo = migrations.pending(conn, database.schema)
            if todo:
                raise CheckFailed(
                    f"{len(todo)} migration(s) pending in schema {database.schema}: "
                    "run `pgqctl migrate`"
                )
            say(f"schema {database.schema} is up to date")
            return
        if dry_run:
            todo = migrations.pending(conn, database.schema)
            for m in todo:
                click.echo(m.name)
            say(f"{len(todo)} migration(s) would be applied" if todo else "nothing to do")
            return
        applied = migrations.apply(
            conn, database.schema, on_applied=lambda m: say(f"applied {m.name}")
        )
        if not applied:
            say(f"nothing to do: schema {database.schema} is up to date")


# --- enqueue -----------------------------------------------------------------


class Timestamp(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """An ISO 8601 time; a naive one is local time."""

    name = "timestamp"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        try:
            hint = param.get_error_hint(ctx) if param and ctx else "time"
            return parse_run_at(value, what=hint)
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


def _one_queue(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A PGQCTL_QUEUE naming several queues is a worker's: a job would go to
    a queue called "emails reports" that no worker reads."""
    from_env = param.name and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
    names = value.split()
    if not from_env or not names:
        return value
    if len(names) > 1:
        raise click.BadParameter(
            f"{value!r} names several queues, as a worker's list does; "
            "a job goes to one queue: pass --queue",
            ctx,
            param,
        )
    return names[0]  # "mail " is the queue a worker reads as mail


@command("enqueue")
@database_options
@click.argument("kind", required=False)
@click.argument("payload", required=False)
@click.option(
    "--queue",
    default="default",
    show_default=True,
    callback=_one_queue,
    help="Queue to put the job in.",
)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", type=DURATION, help="Due after this long: 30s, 5m, 2h, 1d or seconds.")
@click.option(
    "--run-at", type=Timestamp(), help="Due at this ISO 8601 time (without offset: local time)."
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Attempts before the job fails for good.",
)
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    allow_from_autoenv=False,  # a PGQCTL_FILE in the environment would hijack every enqueue
    help="Bulk-load JSON lines from this file (- for stdin).",
)
@format_options
def enqueue_command(
    database: Database,
    kind: str | None,
    payload: str | None,
    queue: str,
    priority: int,
    delay: float | None,
    run_at: dt.datetime | None,
    max_attempts: int,
    path: str | None,
    fmt: str,
) -> None:
    """Add a job (KIND, with a JSON object PAYLOAD, default {}) and print its id.

    With --file, add one job per line of a JSON-lines file instead, each an
    object with "kind" and optionally "payload", "queue", "priority",
    "run_at", "delay", "max_attempts"; the options above fill what a line
    leaves out. The whole file goes in one transaction: one bad line and
    nothing is added.

    \b
    Example:
        pgqctl enqueue hello '{"argv": ["echo", "hello"]}'
        pgqctl enqueue report '{"argv": ["./report.sh"]}' --delay 5m --queue slow
        pgqctl enqueue --file jobs.jsonl
        printf '%s\\n' '{"kind": "ping", "payload": {"argv": ["true"]}}' | pgqctl enqueue --file -
    """
    if delay is not None and run_at is not None:
        raise click.UsageError("give --delay or --run-at, not both")
    options = {
        "queue": queue,
        "priority": priority,
        "run_at": run_at,
        "delay": delay,
        "max_attempts": max_attempts,
    }
    if path is not None:
        if kind is not None:
            raise click.UsageError("give KIND [PAYLOAD] or --file, not both")
        # Options given (on the command line or as PGQCTL_*) fill what lines leave out.
        source = click.get_current_context().get_parameter_source
        given = {k: v for k, v in options.items() if source(k) is not ParameterSource.DEFAULT}
        make_job("-", **given)  # a bad option is reported once, not on every line
        _enqueue_file(database, path, given, fmt)
        return
    if kind is None:
        raise click.UsageError("missing KIND (or --file F to load many jobs)")
    job = make_job(kind, parse_payload(payload) if payload is not None else None, **options)
    with database.connect() as conn:
        ids = insert_jobs(conn, [job])
    _emit_ids(ids, fmt)


def _enqueue_file(database: Database, path: str, defaults: dict[str, Any], fmt: str) -> None:
    source = "stdin" if path == "-" else path
    try:
        with _gc_skips_older_objects(), click.open_file(path, "rb") as f, _progress(f) as progress:
            lines = f if progress is None else progress.lines(f)
            # Lines are validated while they stream to the server; a bad one
            # aborts the transaction. The first job is read before connecting,
            # so an empty or plainly wrong file never touches the database.
            rows = read_rows(lines, source=source, defaults=defaults)
            first = next(rows, None)
            if first is None:
                say(f"nothing to enqueue: {source} has no jobs")
                _emit_ids([], fmt)
                return
            with database.connect() as conn:
                ids = insert_rows(
                    conn,
                    itertools.chain([first], rows),
                    on_progress=None if progress is None else progress.sent,
                )
    except BadInput as exc:
        raise BadInput(f"{exc}; nothing was enqueued") from None
    say(f"enqueued {len(ids)} job{'' if len(ids) == 1 else 's'} {_id_span(ids)}")
    # Thousands of ids on a terminal are noise: there, the line above says it all.
    if not (sys.stdout.isatty() and fmt in ("auto", *output.HUMAN_FORMATS)):
        _emit_ids(ids, fmt)


@contextmanager
def _gc_skips_older_objects() -> Iterator[None]:
    """Keep the garbage collector's full passes off the objects that exist already.

    A bulk load makes short-lived objects by the hundred thousand, which
    triggers full passes; each would walk every module, class and function
    imported at startup again.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _emit_ids(ids: list[int], fmt: str) -> None:
    """Print the ids of jobs just committed; if they cannot be written, say
    that the jobs are in the queue all the same (a retry would add them twice)."""
    try:
        if fmt in ("auto", *output.HUMAN_FORMATS):
            # Bare ids, one a line, so that `id=$(pgqctl enqueue ...)` works.
            if ids:
                click.echo("\n".join(map(str, ids)))
        else:
            output.emit_ids(ids, fmt)
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader left (`| head`): not an error
    except OSError as exc:
        if not ids:
            raise
        one = len(ids) == 1
        raise PgqctlError(
            f"enqueued {_plural(len(ids), 'job')} {_id_span(ids)} but could not write "
            f"{'its id' if one else 'their ids'}: {exc.strerror or exc}; "
            f"{'it is' if one else 'they are'} in the queue: "
            f"do not enqueue {'it' if one else 'them'} again"
        ) from exc


def _id_span(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"(id {ids[0]})"
    contiguous = ids[-1] - ids[0] == len(ids) - 1
    return f"(ids {ids[0]}..{ids[-1]})" if contiguous else f"(ids from {ids[0]} to {ids[-1]})"


class _Progress:
    """A progress bar on stderr over the bytes of the file read so far."""

    def __init__(self, size: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("enqueueing", total=size)

    def lines(self, f: Iterable[bytes]) -> Iterator[bytes]:
        done = 0
        for number, line in enumerate(f, start=1):
            done += len(line)
            if number % 10000 == 0:
                self.bar.update(self.task, completed=done)
            yield line
        self.bar.update(self.task, completed=done)

    def sent(self, count: int) -> None:
        self.bar.update(self.task, description=f"enqueueing: {count:,} jobs")


@contextmanager
def _progress(f: Any) -> Iterator[_Progress | None]:
    """A progress bar when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        size = os.fstat(f.fileno()).st_size  # 0 for a pipe: the bar then just pulses
    except (OSError, ValueError):
        size = 0
    progress = _Progress(size or None)
    with progress.bar:
        yield progress


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


@command("status", group=embedded_group)
@format_options
def embedded_status(fmt: str) -> None:
    """Show whether the embedded PostgreSQL exists and runs."""
    from pgqctl import embedded

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


@command("stop", group=embedded_group)
def embedded_stop() -> None:
    """Stop the embedded PostgreSQL (its data is kept)."""
    from pgqctl import embedded

    if embedded.stop():
        say("stopped the embedded PostgreSQL")
    else:
        say("the embedded PostgreSQL was not running")


@command("dsn", group=embedded_group)
def embedded_dsn() -> None:
    """Print the embedded server's connection string, starting it if needed.

    \b
    Example:
        export PGQCTL_DSN="$(pgqctl embedded dsn)"
    """
    from pgqctl import embedded

    started = embedded.ensure_running()
    if started.started:
        say(_started(started))
    click.echo(started.dsn)


# --- operator commands: stats, leases, list, show, reap, requeue, purge --------

JOB_STATUSES = click.Choice(queue.STATUSES)
LIST_COLUMNS = ["id", "queue", "kind", "status", "attempt", "run_at", "finished_at", "error"]
CHANGE_COLUMNS = ["id", "queue", "kind", "status", "attempt", "error"]


def _human(fmt: str) -> bool:
    return output.resolve_format(fmt) in output.HUMAN_FORMATS


def _one_line(text: str | None, width: int = 60) -> str:
    """The first line of an error, cut to fit a table cell."""
    lines = (text or "").strip().splitlines()
    first = lines[0] if lines else ""
    return first if len(first) <= width else first[: width - 1] + "…"


def _job_cells(job: queue.Job) -> dict[str, Any]:
    """A job as the human tables show it; JSON and CSV carry the job itself."""
    left = job.get("seconds_left")
    if left is not None:
        left = output.format_seconds(float(left))
    elif "seconds_left" in job:  # a lease listing: a running job without a lease
        left = "no lease"
    return {
        **job,
        "attempt": f"{job['attempts']}/{job['max_attempts']}",
        "left": left or "",
        "error": _one_line(job.get("last_error")),
    }


def _emit_jobs(
    jobs: list[queue.Job],
    columns: list[str],
    fmt: str,
    fields: Sequence[str] = queue.JOB_FIELDS,
) -> None:
    """Jobs as a table of `columns`, or as records of their `fields`."""
    if _human(fmt):
        output.emit_rows([_job_cells(j) for j in jobs], columns, fmt)
    else:
        output.emit_rows(jobs, fields, fmt)


def _emit_object(obj: dict[str, Any], fmt: str) -> None:
    """A one-object result: JSON, or a one-row CSV/TSV. Human formats say it on stderr."""
    if output.resolve_format(fmt) in ("csv", "tsv"):
        output.emit_rows([obj], list(obj), fmt)
    elif not _human(fmt):
        output.emit_object(obj)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@command("stats")
@database_options
@click.option(
    "--exact", is_flag=True, help="Count done jobs exactly (reads the whole finished history)."
)
@click.option(
    "--watch",
    type=DURATION,
    metavar="SECONDS",
    help="Refresh every SECONDS (in place on a terminal) until Ctrl-C.",
)
@format_options
def stats_command(database: Database, exact: bool, watch: float | None, fmt: str) -> None:
    """Jobs per status, in total and per queue, with expired leases and the
    age of the oldest due pending job.

    Pending, running and failed counts are exact. Done counts are exact up to
    1,000 done jobs; beyond that they are estimated from PostgreSQL's table
    statistics (marked ~, and "estimated": true in JSON), so stats stays cheap
    on a long history. --exact counts them.

    \b
    Example:
        pgqctl stats
        pgqctl stats --watch 2
        pgqctl stats --json | jq '.totals.failed'
    """
    if watch is not None and watch <= 0:
        raise BadInput("--watch needs a positive number of seconds, such as --watch 2")
    with database.connect() as conn:

        def snapshot() -> queue.Stats:
            return queue.stats(conn, exact=exact)

        if watch is None:
            _show_stats(snapshot(), fmt)
        elif output.resolve_format(fmt) == "table":
            output.live(lambda: _stats_table(snapshot()), watch)
        else:
            try:
                while True:
                    _show_stats(snapshot(), fmt)
                    sys.stdout.flush()
                    time.sleep(watch)
            except KeyboardInterrupt:
                return


STATS_COLUMNS = ["queue", "pending", "running", "expired", "done", "failed", "oldest_pending"]


def _stats_rows(stats: queue.Stats) -> list[dict[str, Any]]:
    """One row per queue and a total row, as the human tables show them."""
    mark = "~" if stats.estimated else ""
    scopes = [*stats.queues.items(), ("(total)", stats.totals)]
    return [
        {
            "queue": name,
            "pending": c.pending,
            "running": c.running,
            "expired": c.expired_leases,
            "done": f"{mark}{c.done}",
            "failed": c.failed,
            "oldest_pending": (
                ""
                if c.oldest_pending_age_seconds is None
                else output.format_seconds(c.oldest_pending_age_seconds)
            ),
        }
        for name, c in scopes
    ]


ESTIMATE_NOTE = "~ marks estimated done counts; --exact counts them"


def _stats_table(stats: queue.Stats) -> Any:
    caption = ESTIMATE_NOTE if stats.estimated else None
    return output.rich_table(_stats_rows(stats), STATS_COLUMNS, caption=caption)


def _show_stats(stats: queue.Stats, fmt: str) -> None:
    data = stats.as_json()
    resolved = output.resolve_format(fmt)
    if resolved in ("json", "ndjson"):
        output.emit_object(data)
    elif resolved in ("csv", "tsv"):
        total = {"queue": "(total)", **vars(stats.totals)}
        rows = [{**r, "estimated": stats.estimated} for r in [*data["queues"], total]]
        output.emit_rows(rows, list(rows[0]), fmt)
    else:
        output.emit_rows(_stats_rows(stats), STATS_COLUMNS, fmt)
        if stats.estimated:
            say(ESTIMATE_NOTE)


@command("leases")
@database_options
@click.option("--expired", is_flag=True, help="Only leases that are over (what reap takes).")
@format_options
def leases_command(database: Database, expired: bool, fmt: str) -> None:
    """Running jobs: who holds each lease, when it ends, and the time left
    (negative when overdue), soonest end first.

    \b
    Example:
        pgqctl leases
        pgqctl leases --expired --json | jq '.[].id'
    """
    with database.connect() as conn:
        jobs = queue.leases(conn, expired_only=expired)
    columns = ["id", "queue", "kind", "attempt", "locked_by", "locked_until", "left"]
    _emit_jobs(jobs, columns, fmt, queue.LEASE_FIELDS)
    if not jobs:
        say("no expired leases" if expired else "no running jobs")


@command("list")
@database_options
@selection_option("--status", type=JOB_STATUSES, help="Only jobs in this status.")
@selection_option("--queue", "queue_name", metavar="QUEUE", help="Only jobs of this queue.")
@selection_option("--kind", metavar="KIND", help="Only jobs of this kind.")
@click.option("--limit", type=COUNT, default=50, show_default=True, help="At most this many.")
@format_options
def list_command(
    database: Database,
    status: str | None,
    queue_name: str | None,
    kind: str | None,
    limit: int,
    fmt: str,
) -> None:
    """Jobs, newest first, with the first line of their last error.

    \b
    Example:
        pgqctl list --status failed
        pgqctl list --queue emails --kind send_receipt --limit 10
        pgqctl list --status pending --json | jq length
    """
    with database.connect() as conn:
        jobs = queue.list_jobs(conn, status=status, queue=queue_name, kind=kind, limit=limit)
    _emit_jobs(jobs, LIST_COLUMNS, fmt)
    if not jobs:
        say("no jobs match")


@command("show")
@database_options
@click.argument("job_id", metavar="ID", type=JOB_ID)
@format_options
def show_command(database: Database, job_id: int, fmt: str) -> None:
    """One job, whole: every column, the payload pretty-printed and the full
    last error.

    \b
    Example:
        pgqctl show 42
        pgqctl show 42 --json | jq .payload
    """
    with database.connect() as conn:
        job = queue.get_job(conn, job_id)
    if job is None:
        raise NotFound(
            f"job {job_id} not found in schema {database.schema}: "
            "`pgqctl list` shows the jobs there"
        )
    if _human(fmt):
        shown = {**job, "payload": json.dumps(job["payload"], indent=2, ensure_ascii=False)}
        rows = [{"field": k, "value": v} for k, v in shown.items()]
        output.emit_rows(rows, ["field", "value"], fmt)
    else:
        _emit_object(job, fmt)


@command("reap")
@database_options
@selection_option("--dry-run", is_flag=True, help="Show what would change; change nothing.")
@click.option("--quiet", "-q", is_flag=True, help="Print only when something changed (cron).")
@format_options
def reap_command(database: Database, dry_run: bool, quiet: bool, fmt: str) -> None:
    """Reclaim expired leases: each job goes back to pending, or to failed
    when it has used all its attempts.

    Jobs a worker is updating at this instant are skipped, not waited on, so
    reap is safe to run from cron while workers run; concurrent reaps never
    handle the same job twice. Workers are woken for the jobs made pending.

    \b
    Example:
        pgqctl reap --dry-run
        * * * * *  pgqctl reap --quiet      # crontab: every minute
    """
    with database.connect() as conn:
        jobs = queue.reap_preview(conn) if dry_run else queue.reap(conn)
    if not jobs and quiet:
        return
    _emit_jobs(jobs, CHANGE_COLUMNS, fmt, queue.REAP_FIELDS)
    if quiet:
        return
    if not jobs:
        say("no expired leases")
        return
    failed = sum(1 for j in jobs if j["status"] == "failed")
    verb = "would reap" if dry_run else "reaped"
    say(
        f"{verb} {_plural(len(jobs), 'expired lease')}: "
        f"{len(jobs) - failed} back to pending, {failed} failed (out of attempts)"
    )


@command("requeue")
@database_options
@selection_option("--failed", "all_failed", is_flag=True, help="Every failed job.")
@selection_option("--id", "ids", type=JOB_ID, multiple=True, help="This job (repeatable).")
@selection_option("--kind", metavar="KIND", help="Only failed jobs of this kind.")
@selection_option("--queue", "queue_name", metavar="QUEUE", help="Only failed jobs of this queue.")
@selection_option(
    "--since", type=DURATION, metavar="DURATION", help="Only jobs failed within, e.g. 1h."
)
@selection_option(
    "--attempts",
    "more",
    type=click.IntRange(min=1, max=1_000_000),
    default=1,
    show_default=True,
    help="Tries each job gets: max_attempts becomes attempts + N.",
)
@selection_option("--dry-run", is_flag=True, help="Show what would move; change nothing.")
@format_options
def requeue_command(
    database: Database,
    all_failed: bool,
    ids: tuple[int, ...],
    kind: str | None,
    queue_name: str | None,
    since: float | None,
    more: int,
    dry_run: bool,
    fmt: str,
) -> None:
    """Move failed jobs back to pending, due now.

    Select every failed job with --failed, or narrow with --id, --kind,
    --queue and --since (each given narrows further). Each job gets --attempts
    more tries: attempts is kept (it fences stale workers) and max_attempts is
    raised. last_error is kept until the next attempt replaces it.

    \b
    Example:
        pgqctl requeue --id 5
        pgqctl requeue --failed --kind send_receipt --since 1h --dry-run
        pgqctl requeue --queue emails --attempts 3
    """
    selection = queue.Selection(ids=ids, kind=kind, queue=queue_name, since=since)
    if not all_failed and selection == queue.Selection():
        raise BadInput(
            "nothing selected: give --failed to requeue every failed job, "
            "or narrow with --id, --kind, --queue or --since"
        )
    with database.connect() as conn:
        result = queue.requeue(conn, selection, more=more, dry_run=dry_run)
    _emit_jobs(result.jobs, CHANGE_COLUMNS, fmt)
    for job_id, status in result.left.items():
        if status is None:
            say(f"job {job_id} not found")
        elif status == "failed":
            say(f"job {job_id} is failed but does not match the other filters: left as it is")
        else:
            say(f"job {job_id} is {status}, not failed: left as it is")
    verb = "would requeue" if dry_run else "requeued"
    say(f"{verb} {_plural(len(result.jobs), 'job')}" if result.jobs else "no failed jobs match")
    if None in result.left.values():
        raise NotFound(
            "some --id jobs do not exist: `pgqctl list --status failed` lists the failed ones"
        )


@command("purge")
@database_options
@selection_option(
    "--status",
    "statuses",
    type=click.Choice(["done", "failed", "all"]),
    multiple=True,
    default=["done"],
    show_default=True,
    help="Finished status to delete (repeatable; all = done and failed).",
)
@selection_option(
    "--older-than",
    type=DURATION,
    default=0.0,
    metavar="DURATION",
    help="Only jobs finished longer ago than this, e.g. 7d.",
)
@click.option(
    "--batch-size",
    type=COUNT,
    default=10_000,
    show_default=True,
    help="Rows deleted per transaction.",
)
@selection_option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@format_options
def purge_command(
    database: Database,
    statuses: tuple[str, ...],
    older_than: float,
    batch_size: int,
    dry_run: bool,
    fmt: str,
) -> None:
    """Delete finished jobs, done by default, in batches of short transactions
    so workers never wait on more than one batch.

    Only jobs that finished before the purge started are deleted; pending and
    running jobs are never touched.

    \b
    Example:
        pgqctl purge --older-than 7d
        pgqctl purge --status failed --older-than 30d --dry-run
        pgqctl purge --status all --json
    """
    chosen = sorted(
        {s for choice in statuses for s in (queue.FINISHED if choice == "all" else [choice])}
    )
    what = f"{' and '.join(chosen)} jobs" + (
        f" finished more than {output.format_seconds(older_than)} ago" if older_than else ""
    )
    with database.connect() as conn:
        plan = queue.purge_plan(conn, chosen, older_than)
        if dry_run:
            matched = queue.purge_count(conn, plan)
            _emit_object({"deleted": 0, "dry_run": True, "matched": matched}, fmt)
            say(f"would delete {matched} {what}")
            return
        total = queue.purge_count(conn, plan) if sys.stderr.isatty() else None
        with output.progress(total, f"deleting {what}") as advance:
            deleted = queue.purge(conn, plan, batch_size=batch_size, on_batch=advance)
    _emit_object({"deleted": deleted}, fmt)
    say(f"deleted {deleted} {what}")


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
    help="On SIGTERM/SIGINT/SIGHUP, how long running jobs may finish before they are stopped.",
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
    type=COUNT,
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

    SIGTERM, SIGINT or SIGHUP: claim nothing more, let running jobs finish for
    --grace, then stop them and hand them back; a second signal stops them
    at once. Logs one line per job event on stderr.

    \b
    Example:
        pgqctl worker --concurrency 8
        pgqctl worker --queue emails --handler 'send_receipt=bin/send-receipt' --burst
        pgqctl worker --kind report --timeout 10m --log-format json
    """
    from pgqctl.worker import CONNECTION_PARAMS, Worker, WorkerConfig, prepare_session
    from pgqctl.worklog import WorkLog

    if lease < 1:
        raise BadInput("--lease must be at least 1s (it is renewed every third of it)")
    if poll <= 0:
        raise BadInput("--poll must be more than 0s, e.g. --poll 5s")
    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be more than 0s; leave it out for no limit")
    _ensure_open_files(concurrency)
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
    log = WorkLog(sys.stderr, log_format, debug=_debugging())
    worker = Worker(settings, connect, log, describe_target=config.describe(dsn))
    return worker.run(conn)


def _ensure_open_files(concurrency: int) -> None:
    """Make room for --concurrency jobs under the open-file limit: raise the
    soft limit (up to the hard one) if need be, or refuse. Without it, jobs
    would fail to start one by one ("too many open files"), each losing an
    attempt. (Jobs inherit the raised soft limit.)"""
    import resource

    from pgqctl.runner import open_files_needed

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = open_files_needed(concurrency)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        raise BadInput(
            f"--concurrency {concurrency} needs up to {need} open files and the hard "
            f"limit is {hard}: raise it (ulimit -Hn, LimitNOFILE= in systemd) "
            "or lower --concurrency"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


# Last, once every command exists: each option reads PGQCTL_<OPTION>.
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
