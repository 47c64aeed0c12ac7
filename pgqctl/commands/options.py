"""What the commands share: option types, option decorators, and the
connection each command opens on demand.

`pgqctl --help` loads this module and no command's: psycopg and the library
modules are imported by the functions that use them, when a command runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

import click

from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput
from pgqctl.formats import FORMATS

if TYPE_CHECKING:  # imported when a command runs, not at start-up
    import psycopg

    from pgqctl import db
    from pgqctl.blockers import Timeouts
    from pgqctl.embedded import EmbeddedStart

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"]}
DEBUG_HELP = "Show tracebacks on errors."


def say(message: str) -> None:
    """A message for the person at the terminal: always stderr, one line
    whatever the names it quotes hold."""
    from pgqctl.text import LINE_ESCAPES, printable

    click.echo(f"pgqctl: {printable(message, LINE_ESCAPES)}", err=True)


def debugging() -> bool:
    """--debug (or PGQCTL_DEBUG), given before the command or after it."""
    ctx = click.get_current_context()
    return any(c.params.get("debug") for c in (ctx, ctx.find_root()))


class OnceOption(click.Option):
    """An option that says what a command reads or changes (the database, a
    filter, a field of the job it writes) and takes one value: a second one
    is refused, where click would keep the last. `enqueue --queue a --queue
    b` puts the job in no queue the user can be sure of; options that tune
    how a command runs (a worker's --concurrency) keep click's way."""


def refuse_repeats(ctx: click.Context, args: list[str]) -> None:
    """UsageError for a OnceOption given more than once.

    Flags and repeatable options may come again. The values are never
    shown: one may be a DSN with its password.
    """
    command = ctx.command
    single: dict[str, click.Option] = {}
    takes_value: set[str] = set()
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        for name in param.opts:
            if not param.is_flag and not param.count:
                takes_value.add(name)
                if not param.multiple and isinstance(param, OnceOption):
                    single[name] = param
    seen: dict[str, int] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return
        name, eq, _ = arg.partition("=")
        if name in takes_value and not eq:
            i += 1  # its value, whatever it looks like
        if name in single:
            option = single[name]
            seen[option.name or name] = seen.get(option.name or name, 0) + 1
            if seen[option.name or name] > 1:
                flag = max(option.opts, key=len)
                raise click.UsageError(f"{flag} was given more than once: it takes one value", ctx)
        elif not arg.startswith("-") and isinstance(command, click.Group):
            return  # the subcommand's name: what follows is its own
        i += 1


class OnceCommand(click.Command):
    """A command whose single-value options refuse a second value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeats(ctx, args)
        return super().parse_args(ctx, args)


class OnceGroup(click.Group):
    """A group whose single-value options refuse a second value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        refuse_repeats(ctx, args)
        return super().parse_args(ctx, args)


def command(name: str, **kwargs: Any) -> Callable[[F], click.Command]:
    """A command whose options read PGQCTL_<OPTION> (see `cli.name_envvars`).

    Each also takes --debug, as people type it after the command too, and
    refuses a global option given before it that it does not take.
    """

    def decorate(func: F) -> click.Command:
        @functools.wraps(func)
        def wrapper(*args: Any, debug: bool, **kw: Any) -> Any:
            # `cli.main` and `debugging` see `debug`.
            ctx = click.get_current_context()
            taken = {p.name for p in ctx.command.params}
            for name, flag in GLOBAL_FLAGS.items():
                if name not in taken and given_before(name) not in (None, False):
                    raise click.UsageError(f"`{ctx.command_path}` takes no {flag}")
            return func(*args, **kw)

        made: click.Command = click.command(  # type: ignore[no-untyped-call]
            name, cls=OnceCommand, context_settings=CONTEXT, **kwargs
        )(wrapper)
        made.params.append(click.Option(["--debug"], is_flag=True, help=DEBUG_HELP))
        return made

    return decorate


# --- global options ------------------------------------------------------------
#
# --dsn, --schema, --format, --json and the timeouts may come before the
# command as well as after it (`pgqctl --schema staging list`), as --debug
# does. Before it, they are read from the command line only (the command's
# own options read the PGQCTL_ variables); given in both places, they are
# refused.

GLOBAL_FLAGS = {
    "dsn": "--dsn",
    "schema": "--schema",
    "fmt": "--format",
    "as_json": "--json",
    "lock_timeout": "--lock-timeout",
    "statement_timeout": "--statement-timeout",
}


def global_options(func: F) -> F:
    """The options the `pgqctl` group takes for its commands."""
    for decorator in reversed(
        (
            click.option(
                "--dsn",
                cls=OnceOption,
                metavar="DSN",
                allow_from_autoenv=False,
                help="As the command's --dsn, for any command.",
            ),
            click.option(
                "--schema",
                cls=OnceOption,
                type=SCHEMA,
                allow_from_autoenv=False,
                help="As the command's --schema.",
            ),
            click.option(
                "--lock-timeout",
                cls=OnceOption,
                type=DURATION,
                metavar="DURATION",
                allow_from_autoenv=False,
                help="As the command's --lock-timeout.",
            ),
            click.option(
                "--statement-timeout",
                cls=OnceOption,
                type=DURATION,
                metavar="DURATION",
                allow_from_autoenv=False,
                help="As the command's --statement-timeout.",
            ),
            click.option(
                "--format",
                "fmt",
                type=click.Choice(FORMATS),
                allow_from_autoenv=False,
                help="As the command's --format.",
            ),
            click.option(
                "--json",
                "as_json",
                is_flag=True,
                allow_from_autoenv=False,
                help="As the command's --json.",
            ),
        )
    ):
        func = decorator(func)
    return func


def given_before(name: str) -> Any:
    """A global option's value given before the command, or None (False for --json)."""
    ctx = click.get_current_context()
    root = ctx.find_root()
    return None if root is ctx else root.params.get(name)


def _from_command_line(name: str) -> bool:
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE


def _twice(flag: str) -> click.UsageError:
    return click.UsageError(f"{flag} was given before the command and after it: give it once")


def selection_option(*names: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that chooses what a command changes: never read from the environment.

    A PGQCTL_QUEUE meant for workers must not quietly narrow a `requeue`, and
    a stray PGQCTL_DRY_RUN must not turn a cron job into a no-op.
    """
    return click.option(  # type: ignore[return-value]
        *names, cls=OnceOption, allow_from_autoenv=False, **kwargs
    )


# The filters `list`, `requeue` and `cancel` share: each narrows the
# selection, and one given several times matches any of its values.
def id_filter(f: F) -> F:
    return selection_option(
        "--id", "ids", type=JOB_ID, multiple=True, help="This job (repeatable)."
    )(f)


def queue_filter(f: F) -> F:
    return selection_option(
        "--queue",
        "queues",
        metavar="QUEUE",
        multiple=True,
        help="Only jobs of this queue (repeatable: any of them).",
    )(f)


def kind_filter(f: F) -> F:
    return selection_option(
        "--kind",
        "kinds",
        metavar="KIND",
        multiple=True,
        help="Only jobs of this kind (repeatable: any of them).",
    )(f)


def error_filter(f: F) -> F:
    return selection_option(
        "--error",
        metavar="TEXT",
        callback=_not_empty,
        help="Only jobs whose last_error holds TEXT (any case; not a pattern: % and _ are "
        "themselves).",
    )(f)


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value == "":
        raise click.BadParameter("empty: give the text to look for in last_error", ctx, param)
    return value


def no_empty_names(ctx: click.Context, param: click.Parameter, values: Any) -> Any:
    """A callback refusing an empty name in a repeatable --queue or --kind:
    `worker --queue ''` would claim from no queue at all while looking
    like a worker that serves them all (an unset shell variable)."""
    flag = max(getattr(param, "opts", ["--" + str(param.name)]), key=len)
    if any(not value for value in values):
        raise click.BadParameter(
            f"an empty name matches no job: leave {flag} out to take them all", ctx, param
        )
    if any(value.isspace() for value in values):
        # enqueue refuses such a name, so no job has it.
        raise click.BadParameter(
            f"a name of only spaces matches no job: give the name jobs are enqueued with, "
            f"or leave {flag} out to take them all",
            ctx,
            param,
        )
    return values


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
    """`30s`, `5m`, `2h`, `1d`, `1w`, `250ms`, `1h30m` or seconds, as a float
    number of seconds. An `age` (how long ago) needs a unit. With `auto`, the
    word auto is None: the command chooses as it goes."""

    name = "duration"

    def __init__(self, *, age: bool = False, auto: bool = False) -> None:
        self.age = age
        self.auto = auto

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:  # float, or None for auto
        if isinstance(value, (int, float)):  # a default given in code
            return float(value)
        if self.auto and (value is None or str(value).strip().lower() == "auto"):
            return None
        try:
            # Click's message already names the option.
            return parse_duration(str(value), what="", age=self.age)
        except BadInput as exc:
            self.fail(f"{exc}, or auto" if self.auto else str(exc), param, ctx)


DURATION = Duration()
DURATION_OR_AUTO = Duration(auto=True)
# How long ago: `purge --older-than 7` could mean days as well as seconds.
AGE = Duration(age=True)
# A count the database stores or compares as a 32-bit integer.
COUNT = click.IntRange(min=1, max=2**31 - 1)


def max_payload_bytes_option(effect: str) -> Callable[[F], F]:
    """--max-payload-bytes, as `enqueue` and the worker take it: what it does
    to a longer payload is `effect`, the rest of the help is the same."""
    from pgqctl.limits import MAX_PAYLOAD_BYTES

    return click.option(
        "--max-payload-bytes",
        cls=OnceOption,
        type=COUNT,
        default=MAX_PAYLOAD_BYTES,
        show_default=True,
        metavar="BYTES",
        help=f"{effect} a payload longer than this as JSON text (UTF-8), "
        "e.g. --max-payload-bytes 4194304.",
    )


class SchemaName(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """A schema PostgreSQL lets pgqctl create and keeps as given.

    An empty name, a reserved pg_ name (pg_temp, pg_catalog) or one longer
    than the server's 63 bytes would otherwise fail later with a raw error,
    or be cut short silently and name another schema.
    """

    name = "text"  # its metavar, as before it was checked

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        name = str(value)
        if not name:
            self.fail("a schema name cannot be empty: leave --schema out for public", param, ctx)
        if name.lower().startswith("pg_"):
            self.fail(
                f"{name!r} is reserved by PostgreSQL (names starting with pg_): choose another",
                param,
                ctx,
            )
        if "\0" in name:
            self.fail("a schema name cannot hold a NUL character", param, ctx)
        size = len(name.encode())
        if size > MAX_IDENTIFIER_BYTES:
            self.fail(
                f"a schema name has at most {MAX_IDENTIFIER_BYTES} bytes, this one has {size} "
                "(PostgreSQL would cut it short): choose a shorter one",
                param,
                ctx,
            )
        return name


# PostgreSQL's NAMEDATALEN - 1: a longer identifier is truncated without error.
MAX_IDENTIFIER_BYTES = 63
SCHEMA = SchemaName()


class Timestamp(click.ParamType):  # type: ignore[type-arg]  # generic only in newer click
    """An ISO 8601 time; a naive one is local time."""

    name = "timestamp"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> dt.datetime:
        from pgqctl.intake.fields import parse_run_at

        try:
            # Click's message already names the option.
            return parse_run_at(value, what="")
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


# How long a command's statements may wait for a lock, and run, unless
# --lock-timeout and --statement-timeout say otherwise: long enough for any
# healthy read or write, short enough that a command behind a lock ends with
# the name of its holder before anyone wonders.
LOCK_TIMEOUT = "5s"
STATEMENT_TIMEOUT = "1m"


@dataclass
class Database:
    """Where this invocation connects; the connection is opened on demand."""

    dsn_option: str | None
    schema: str
    last: db.QueueConnection | None = None  # the connection opened last
    source: str | None = None  # where the DSN came from (`config.Target.source`)
    timeouts: Timeouts = field(default_factory=lambda: _timeouts(0.0, 0.0))  # 0: none
    command: str = "pgqctl"  # for messages: `stats`, `schedule sync`
    resolved: str | None = None  # the DSN connected to last
    backend: int | None = None  # the server session of the connection opened last

    def dsn(self) -> str:
        from pgqctl import config

        target = config.resolve_target(self.dsn_option, os.environ)
        self.source = target.source
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

        self.resolved = self.dsn()
        self.last = self.reconnect(migrated=migrated, writes=writes)
        self.backend = self.last.info.backend_pid
        return self.last

    def reconnect(self, *, migrated: bool = True, writes: bool = False) -> Any:
        """Another connection to where `connect` connected, with the same
        settings (for a command that keeps several, as `web` does)."""
        from pgqctl import db

        assert self.resolved is not None, "connect first"
        return db.open_queue(
            self.resolved,
            schema=self.schema,
            migrated=migrated,
            writes=writes,
            source=self.source,
            settings=self.timeouts.settings(),
        )

    def explain(self, exc: psycopg.Error) -> Exception | None:
        """The error pgqctl means by a server error (a timeout, naming who
        held the command up; a standby; a missing GRANT); None for another."""
        from pgqctl import db
        from pgqctl.blockers import timed_out

        if self.resolved is None:
            return None
        meant: Exception | None = timed_out(
            exc,
            what=self.command,
            timeouts=self.timeouts,
            dsn=self.resolved,
            schema=self.schema,
            ours=[] if self.backend is None else [self.backend],
        )
        if meant is None and self.last is not None:
            meant = db.explain(exc, self.last)
        return meant

    @contextmanager
    def explained(self) -> Iterator[None]:
        """Server errors raised inside, said as what they mean (see `explain`)."""
        import psycopg

        try:
            yield
        except psycopg.Error as exc:
            meant = self.explain(exc)
            if meant is None:
                raise
            raise meant from exc


@overload
def database_options(func: F) -> F: ...


@overload
def database_options(
    *, lock_timeout: str = ..., statement_timeout: str = ...
) -> Callable[[F], F]: ...


def database_options(
    func: F | None = None,
    *,
    lock_timeout: str = LOCK_TIMEOUT,
    statement_timeout: str = STATEMENT_TIMEOUT,
) -> Any:
    """--dsn, --schema and the timeouts, for every command that talks to the
    queue; `@database_options(lock_timeout=..., statement_timeout=...)` sets
    the command's own defaults."""
    if func is None:
        return functools.partial(
            database_options, lock_timeout=lock_timeout, statement_timeout=statement_timeout
        )

    @click.option(
        "--dsn",
        cls=OnceOption,
        metavar="DSN",
        envvar=None,
        help="PostgreSQL URL or conninfo (else PGQCTL_DSN, DATABASE_URL, PG* variables, "
        "then the embedded server).",
    )
    @click.option(
        "--schema",
        cls=OnceOption,
        type=SCHEMA,
        default="public",
        show_default=True,
        help="Schema holding the jobs table.",
    )
    @click.option(
        "--lock-timeout",
        cls=OnceOption,
        type=DURATION,
        default=lock_timeout,
        show_default=True,
        metavar="DURATION",
        help="Give up when a statement has waited this long for a lock another session "
        "holds, and name that session; 0 waits as long as it takes. E.g. --lock-timeout 30s.",
    )
    @click.option(
        "--statement-timeout",
        cls=OnceOption,
        type=DURATION,
        default=statement_timeout,
        show_default=True,
        metavar="DURATION",
        help="Give up when a statement has run this long, waits included; 0: no limit. "
        "E.g. --statement-timeout 5m.",
    )
    @functools.wraps(func)
    def wrapper(
        *args: Any,
        dsn: str | None,
        schema: str,
        lock_timeout: float,
        statement_timeout: float,
        **kwargs: Any,
    ) -> Any:
        dsn_before, schema_before = given_before("dsn"), given_before("schema")
        if dsn_before is not None:
            if dsn is not None:
                raise _twice("--dsn")
            dsn = dsn_before
        if schema_before is not None:
            if _from_command_line("schema"):
                raise _twice("--schema")
            schema = schema_before  # over PGQCTL_SCHEMA, as after the command
        timeouts = _timeouts(
            lock=_global_or_own("lock_timeout", "--lock-timeout", lock_timeout),
            statement=_global_or_own("statement_timeout", "--statement-timeout", statement_timeout),
        )
        ctx = click.get_current_context()
        what = ctx.command_path.partition(" ")[2] or ctx.command_path
        database = Database(dsn, schema, timeouts=timeouts, command=what)
        # A timeout, a standby, a missing GRANT: said as what they are, with what to do.
        with database.explained():
            return func(*args, database=database, **kwargs)

    return wrapper


def _timeouts(lock: float, statement: float) -> Timeouts:
    from pgqctl.blockers import Timeouts

    return Timeouts(lock=lock, statement=statement)


def _global_or_own(name: str, flag: str, own: float) -> float:
    """A global option given before the command, over the command's own
    (or its PGQCTL_ variable's, or its default); refused in both places."""
    before = given_before(name)
    if before is None:
        return own
    if _from_command_line(name):
        raise _twice(flag)
    return float(before)


def format_options(func: F) -> F:
    """--format and its --json shorthand, for every listing."""

    @click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="auto",
        show_default=True,
        help="auto: a table on a terminal, plain when piped.",
    )
    @click.option("--json", "as_json", is_flag=True, help="Shorthand for --format json.")
    @functools.wraps(func)
    def wrapper(*args: Any, fmt: str, as_json: bool, **kwargs: Any) -> Any:
        fmt_before, json_before = given_before("fmt"), given_before("as_json")
        if fmt_before is not None or json_before:
            if as_json or _from_command_line("fmt"):
                raise _twice("--json" if as_json and json_before else "--format")
            fmt, as_json = fmt_before or fmt, bool(json_before)
        if as_json and fmt not in ("auto", "json") and _from_command_line("fmt"):
            # Which one was meant cannot be told: a script would parse the wrong one.
            raise click.UsageError(f"--json and --format {fmt} disagree: give one of them")
        return func(*args, fmt="json" if as_json else fmt, **kwargs)

    return wrapper  # type: ignore[return-value]


def dead_after_option(func: F) -> F:
    """--dead-after: when a silent worker is dead and its jobs are reaped
    (`reap`, and the worker's own reaps)."""
    from pgqctl.leases import DEAD_AFTER, STALE_AFTER

    return click.option(
        "--dead-after",
        type=click.IntRange(min=STALE_AFTER, max=2**31 - 1),
        metavar="N",
        default=DEAD_AFTER,
        show_default=True,
        help="Reap the jobs of a worker that sent no heartbeat for N of its own "
        f"--heartbeat intervals (it shows stale after {STALE_AFTER}), without waiting "
        "for their leases, e.g. --dead-after 10.",
    )(func)
