"""What the commands share: option types, option decorators, and the
connection each command opens on demand."""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click
import psycopg

from pgqctl import config, db, output
from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput

if TYPE_CHECKING:  # imported by the commands that start it, not at start-up
    from pgqctl.embedded import EmbeddedStart

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"]}
DEBUG_HELP = "Show tracebacks on errors."


def say(message: str) -> None:
    """A message for the person at the terminal: always stderr."""
    click.echo(f"pgqctl: {message}", err=True)


def debugging() -> bool:
    """--debug (or PGQCTL_DEBUG), given before the command or after it."""
    ctx = click.get_current_context()
    return any(c.params.get("debug") for c in (ctx, ctx.find_root()))


def command(name: str, **kwargs: Any) -> Callable[[F], click.Command]:
    """A command whose options read PGQCTL_<OPTION> (see `cli.name_envvars`).

    Each also takes --debug, as people type it after the command too.
    """

    def decorate(func: F) -> click.Command:
        @functools.wraps(func)
        def wrapper(*args: Any, debug: bool, **kw: Any) -> Any:
            return func(*args, **kw)  # `cli.main` and `debugging` see `debug`

        made: click.Command = click.command(  # type: ignore[no-untyped-call]
            name, context_settings=CONTEXT, **kwargs
        )(wrapper)
        made.params.append(click.Option(["--debug"], is_flag=True, help=DEBUG_HELP))
        return made

    return decorate


def selection_option(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that chooses what a command changes: never read from the environment.

    A PGQCTL_QUEUE meant for workers must not quietly narrow a `requeue`, and
    a stray PGQCTL_DRY_RUN must not turn a cron job into a no-op.
    """
    return click.option(*names, allow_from_autoenv=False, **kwargs)  # type: ignore[return-value]


# --- option types ------------------------------------------------------------


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


class Timestamp(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """An ISO 8601 time; a naive one is local time."""

    name = "timestamp"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        from pgqctl.enqueue import parse_run_at

        try:
            hint = param.get_error_hint(ctx) if param and ctx else "time"
            return parse_run_at(value, what=hint)
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


# --- the database ------------------------------------------------------------


def embedded_started(started: EmbeddedStart) -> str:
    """What `embedded.ensure_running` did, for the person who did not ask for it."""
    what = "created and started" if started.created else "started"
    return (
        f"{what} the embedded PostgreSQL in {started.data_dir}; "
        "it keeps running (`pgqctl embedded stop` stops it)"
    )


@dataclass
class Database:
    """Where this invocation connects; the connection is opened on demand."""

    dsn_option: str | None
    schema: str
    last: db.QueueConnection | None = None  # the connection opened last

    def dsn(self) -> str:
        target = config.resolve_target(self.dsn_option, os.environ)
        if target.dsn is not None:
            return target.dsn
        from pgqctl import embedded

        started = embedded.ensure_running()
        if started.started:
            say(
                f"no database configured: {embedded_started(started)}. "
                "Set PGQCTL_DSN or --dsn to use your own database."
            )
        return started.dsn

    def connect(self, *, migrated: bool = True, writes: bool = False) -> Any:
        """A connection to the queue; `writes`: refuse a standby at once."""
        self.last = db.open_queue(self.dsn(), schema=self.schema, migrated=migrated, writes=writes)
        return self.last


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
        database = Database(dsn, schema)
        try:
            return func(*args, database=database, **kwargs)
        except psycopg.Error as exc:
            # A standby, a missing GRANT: said as what they are, with what to do.
            meant = None if database.last is None else db.explain(exc, database.last)
            if meant is None:
                raise
            raise meant from exc

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
