"""Connections with safe defaults, the transactions pgqctl runs on them, and
the checks that the server and the schema can serve the queue.

Nothing here relies on session state, so that every command and the worker
are correct through a transaction pooler (PgBouncer's pool_mode=transaction),
which hands the server connection to another client after each transaction:

- Every transaction names the queue's schema (and the worker's timeouts) with
  transaction-local settings, the first statement of each `transaction()`.
  The SQL itself stays unqualified, as in the classic design.
- Every transaction runs at READ COMMITTED, whatever the server's default
  (`default_transaction_isolation`): the claim's SKIP LOCKED design assumes
  it, and under REPEATABLE READ a claim that meets a row another worker just
  updated fails instead of moving on.
- Behind a pooler psycopg's automatic prepared statements are off: a
  statement prepared by one client stays on the server connection and
  collides with the next client's. A pooler is recognised by the backend
  key it sends: it cannot pass on the server's own.

Every connection names pgqctl in `application_name` (pg_stat_activity), and
loads a time no Python datetime holds ('infinity', a year after 9999: plain
SQL may write one in any job's row) as a `FarTime` rather than failing.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
import select
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq.abc import PGresult

from pgqctl import config
from pgqctl.errors import (
    BadInput,
    DatabaseUnavailable,
    NotMigrated,
    PrivilegeMissing,
    ReadOnlyServer,
)
from pgqctl.fartime import FarTime
from pgqctl.sql import migrations, query

APPLICATION_NAME = "pgqctl"
# Set in every transaction of every connection. Each statement of pgqctl's
# is bounded by an index range or a LIMIT, so none gains from JIT
# compilation, which the server turns on by the plan's estimate: an
# estimate that grows with the history. A list reading 2 ms of a window
# spent 125 ms compiling, at 100 million finished rows.
# Times are read as text in the ISO style, the only one psycopg parses:
# a database may show them its own way (ALTER DATABASE ... SET datestyle),
# which stays the session's for a SQL job's own statement. "ISO" alone
# keeps the day-month order as it was, so a session already in ISO (the
# default) sees no change, and the server reports none.
BASE_SETTINGS = {"jit": "off", "DateStyle": "ISO", "IntervalStyle": "postgres"}
CONNECT_TIMEOUT_SECONDS = 10
# How libpq words a setting it refuses to use, e.g. 'invalid integer value
# "abc" for connection option "port"', 'invalid sslmode value: "x"',
# 'invalid "ssl_min_protocol_version" value', 'could not match 3 port
# numbers to 2 hosts'; the server, 'invalid value for parameter "TimeZone"'.
_BAD_SETTING = re.compile(
    r'invalid (\w+ |"\w+" )?(value|port number)|could not match \d+ port numbers'
)
# How the server words a login it refuses: it runs, so the setting is wrong
# (the role, its password, the database name, pg_hba.conf), not the server.
_LOGIN_REFUSED = re.compile(
    r'(role|database) ".*" does not exist|password authentication failed'
    r"|authentication failed for user|no pg_hba\.conf entry|not permitted to log in"
    r"|permission denied for database|password is required|pg_hba\.conf rejects"
)
READ_ONLY_SQLSTATE = "25006"  # read_only_sql_transaction
PRIVILEGE_SQLSTATE = "42501"  # insufficient_privilege


class QueueConnection(psycopg.Connection[Any]):
    """A connection to the queue in one schema.

    In autocommit mode, as pgqctl opens it: a statement outside
    `transaction()` has no schema, so every query runs inside one.
    """

    schema: str = "public"
    # Names and values set with set_config(..., true) at the start of each transaction.
    local_settings: tuple[tuple[str, str], ...] = ()
    # Whether a pooler stands between us and the server (see the module's doc).
    pooled: bool = False
    # Who and where, kept to explain errors after the connection is closed.
    role: str = ""
    where: str = ""
    # The statements `pipelined` prepared on this connection: text -> name;
    # and how many names it has given (a name is never given twice).
    prepared: dict[bytes, bytes]
    prepared_names: int = 0

    @contextmanager
    def transaction(
        self,
        savepoint_name: str | None = None,
        force_rollback: bool = False,
        *,
        settings: bool = True,
    ) -> Iterator[psycopg.Transaction]:
        """A transaction that begins with the queue's schema and settings;
        with `settings=False`, with the session's own (a SQL handler's
        statement runs on the operator's search_path), until the caller
        sends settings_set_local itself."""
        outermost = self.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outermost and settings:
                self.execute(query("settings_set_local"), self.settings_params())
            yield tx

    @functools.cached_property
    def _settings(self) -> dict[str, Any]:
        # Made once: the worker sends them with every exchange.
        path = sql.Identifier(self.schema).as_string(None)
        names = ["search_path", *(name for name, _ in self.local_settings)]
        values = [path, *(value for _, value in self.local_settings)]
        return {"names": names, "values": values}

    def settings_params(self) -> dict[str, Any]:
        """The parameters of `settings_set_local` for this connection (fixed
        once its schema and settings are)."""
        return self._settings


_TIMESTAMPTZ = psycopg.postgres.types["timestamptz"].oid


class _TimestamptzLoader(Loader):
    """timestamptz as psycopg loads it (its own loader, in C where it has
    one), but a time beyond a datetime as a `FarTime`, not an error."""

    base = psycopg.adapters.get_loader(_TIMESTAMPTZ, psycopg.pq.Format.TEXT)

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        assert self.base is not None
        self._load = self.base(oid, context).load

    def load(self, data: Buffer) -> Any:
        try:
            return self._load(data)
        except psycopg.DataError:
            text = bytes(data).decode()
            if not FarTime.holds(text):  # another error (a DateStyle psycopg cannot read)
                raise
            return FarTime(text)
        except NotImplementedError:
            # psycopg's loader reads the session's DateStyle when it is made,
            # and a pipeline's rows are loaded after its COMMIT gave the
            # session its own style back (a database's ALTER DATABASE ...
            # SET datestyle): the text itself is ISO, as every transaction
            # of pgqctl sets it (BASE_SETTINGS), which psycopg's loader
            # reads when it knows no session (times in UTC, the same instants).
            assert self.base is not None
            self._load = self.base(self.oid, None).load
            return self.load(data)


class _FarTimeDumper(Dumper):
    """A `FarTime` back to PostgreSQL as it came (a claim's floor sends its
    run_at back): 'infinity' stays infinity."""

    oid = _TIMESTAMPTZ

    def dump(self, obj: FarTime) -> bytes:
        return obj.text.encode()


def connect(
    dsn: str,
    *,
    schema: str,
    application_name: str = APPLICATION_NAME,
    settings: Mapping[str, str] | None = None,
    source: str | None = None,
    **params: Any,
) -> QueueConnection:
    """Open a connection or raise DatabaseUnavailable naming the target.

    `settings` are more transaction-local settings (timeouts...); `params`
    more libpq connection parameters (keepalives, ...). `source` says where
    the DSN came from, for the message (see `config.Target.source`); without
    it, the environment tells.
    """
    try:
        conn = QueueConnection.connect(
            dsn,
            autocommit=True,
            application_name=application_name,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            **params,
        )
    except psycopg.OperationalError as exc:
        where = config.source_text(source or config.dsn_source(dsn, os.environ))
        why = reason(exc)
        if _BAD_SETTING.search(why):
            # A setting libpq (or the server) refuses: no use retrying as is.
            raise BadInput(f"bad connection setting: {why}; fix it in {where}") from exc
        if _LOGIN_REFUSED.search(why):
            hint = f"check the user, password and database name in {where}"
        elif "FATAL:" in why:  # the server answered (too many clients, starting up...)
            hint = f"check {where}"
        else:
            hint = f"check {where} and that the server is running"
        raise DatabaseUnavailable(
            f"cannot connect to {config.describe(dsn)}: {why}; {hint}"
        ) from exc
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    conn.adapters.register_loader(_TIMESTAMPTZ, _TimestamptzLoader)
    conn.adapters.register_dumper(FarTime, _FarTimeDumper)
    conn.schema = schema
    conn.role = conn.info.user
    conn.where = f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"
    conn.local_settings = tuple({**BASE_SETTINGS, **(settings or {})}.items())
    conn.prepared = {}
    try:
        # Before anything else: with prepared statements off from the first one.
        conn.prepare_threshold = None
        (backend_pid,) = _one(conn, "server_backend")
        conn.pooled = backend_pid != conn.info.backend_pid
        if not conn.pooled:
            conn.prepare_threshold = 5  # psycopg's default
    except BaseException:
        conn.close()
        raise
    return conn


def open_queue(
    dsn: str,
    *,
    schema: str,
    migrated: bool = True,
    writes: bool = False,
    source: str | None = None,
    **params: Any,
) -> QueueConnection:
    """A connection to the queue in `schema`: checked to be migrated unless
    `migrated` is False (for `migrate` itself), and to be a primary when the
    caller `writes`. `params` as for `connect`."""
    conn = connect(dsn, schema=schema, source=source, **params)
    try:
        if writes:
            require_primary(conn)
        if migrated:
            require_migrated(conn)
    except BaseException:
        conn.close()
        raise
    return conn


Statement = tuple[str, "Mapping[str, Any] | None"]


def pipelined(conn: QueueConnection, statements: Sequence[Statement]) -> list[PGresult]:
    """Send `statements` (SQL blocks and their parameters) in one round trip
    through libpq's pipeline, and return each one's result; raise the first
    error among them. The worker's exchange sends four or more statements
    thousands of times a second, where psycopg's cursors cost the client
    more than the server's work: here each parameter is its text, encoded
    once, and the server infers its type from the statement (as for an
    untyped literal); a statement is prepared on its first use unless a
    pooler stands between (see the module's doc), and no cursor is made.

    The statements must be one transaction, BEGIN to COMMIT, and the
    connection idle and out of a pipeline. Anything else than a statement's
    error (a lost connection, an interrupt) leaves it closed: its
    transaction, if any, is then rolled back by the server."""
    try:
        return _pipelined(conn, statements)
    except psycopg.errors.InvalidSqlStatementName:
        # psycopg deallocates every statement prepared on the connection
        # (DEALLOCATE ALL) when it rolls a transaction back while it holds
        # prepared statements of its own, and ours go with them. The
        # transaction stopped at the first missing one and was rolled back:
        # nothing of it happened. Prepare them again, once.
        conn.prepared.clear()
        return _pipelined(conn, statements)


def _pipelined(conn: QueueConnection, statements: Sequence[Statement]) -> list[PGresult]:
    pgconn = conn.pgconn
    codec = conn.info.encoding
    # What the pipeline holds, in order: a Parse (the statement's text and
    # its name) or None for a statement run.
    sent: list[tuple[bytes, bytes] | None] = []
    with conn.lock:
        pgconn.enter_pipeline_mode()
        try:
            for text, params in statements:
                command, names = _numbered(text)
                values = [_text_param(params[n], codec) for n in names] if params else None
                if conn.pooled:
                    pgconn.send_query_params(command, values)
                else:
                    name = conn.prepared.get(command)
                    if name is None:
                        name = b"pgqctl_%d" % conn.prepared_names
                        conn.prepared_names += 1
                        pgconn.send_prepare(name, command)
                        sent.append((command, name))
                    pgconn.send_query_prepared(name, values)
                sent.append(None)
            pgconn.pipeline_sync()
            answers = _results(pgconn)
            pgconn.exit_pipeline_mode()
        except BaseException:
            conn.close()
            raise
    results = []
    for what, answer in zip(sent, answers, strict=True):
        if what is None:
            results.append(answer)
        elif answer.status == psycopg.pq.ExecStatus.COMMAND_OK:
            conn.prepared[what[0]] = what[1]
    for result in answers:
        if result.status == psycopg.pq.ExecStatus.FATAL_ERROR:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                conn.rollback()
            raise psycopg.errors.error_from_result(result, encoding=codec)
    return results


def _results(pgconn: Any) -> list[PGresult]:
    """Flush the pipeline, then read one result per statement (a statement's
    last, or its error; a statement after an error is answered
    PIPELINE_ABORTED) up to the sync."""
    # poll, not select: a worker with many children's pipes open may hold
    # the socket above select's limit of 1024 descriptors.
    writing, reading = select.poll(), select.poll()
    writing.register(pgconn.socket, select.POLLIN | select.POLLOUT)
    reading.register(pgconn.socket, select.POLLIN)
    while pgconn.flush():
        if any(events & select.POLLIN for _, events in writing.poll()):
            pgconn.consume_input()
    results: list[PGresult] = []
    last = None
    while True:
        while pgconn.is_busy():
            reading.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            if last is not None:
                results.append(last)
            last = None
        elif result.status == psycopg.pq.ExecStatus.PIPELINE_SYNC:
            return results
        else:
            last = result


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@functools.cache
def _numbered(text: str) -> tuple[bytes, tuple[str, ...]]:
    """A block's text with $1, $2... for its %(name)s placeholders (as
    psycopg sends it), and the names in that order."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return "%"
        return f"${names.setdefault(match.group(1), len(names) + 1)}"

    return _PLACEHOLDER.sub(number, text).encode(), tuple(names)


def _text_param(value: Any, codec: str) -> bytes | None:
    """A parameter as PostgreSQL's text input of its type."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode(codec)
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, (int, float)):
        return repr(value).encode()
    if isinstance(value, (list, tuple)):
        return _array_text(value).encode(codec)
    if isinstance(value, FarTime):
        return value.text.encode()
    if isinstance(value, datetime.datetime):
        return value.isoformat().encode()
    raise TypeError(f"no text form for a parameter of type {type(value).__name__}")


def _array_text(values: Sequence[Any]) -> str:
    # Every element quoted, its quotes and backslashes escaped: any text is safe.
    quoted = (
        "NULL" if v is None else '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return "{" + ",".join(quoted) + "}"


def reason(exc: BaseException) -> str:
    """The useful line of a libpq error, without its boilerplate."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0]
    for prefix in ("connection failed: ", "connection is bad: "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def in_batches(
    batch: Callable[[int], int],
    batch_size: int,
    on_batch: Callable[[int], None] | None = None,
    *,
    pause: float | None = 0.0,
) -> int:
    """Run `batch(batch_size)` (one short transaction, returning how many rows
    it took) until a batch takes fewer than a full one: nothing unlocked is
    left. The rows taken in all.

    Between batches it rests `pause` seconds, or with None as long as the last
    batch took: a batch's WAL and CPU are what the workers' commits queue
    behind, so resting as long as it ran leaves them the server half the time.
    """
    done = 0
    while True:
        began = time.monotonic()
        n = batch(batch_size)
        took = time.monotonic() - began
        done += n
        if on_batch and n:
            on_batch(n)
        if n < batch_size:
            return done
        time.sleep(took if pause is None else pause)


def window_start(conn: Any, seconds: float) -> datetime.datetime:
    """The start of the last `seconds` on the server's clock (see
    server_window_start): the history's days before it are left out of the
    plan of a statement given it as a value."""
    (since,) = _one(conn, "server_window_start", {"window": datetime.timedelta(seconds=seconds)})
    return since  # type: ignore[no-any-return]


def batch_across(
    conn: psycopg.Connection[Any],
    statement: str,
    tables: Sequence[str],
    params: Mapping[str, Any],
    batch_size: int,
) -> int:
    """One batch of `statement` (its table written `{table}`; its one row,
    how many rows it took) in one transaction, table after table until
    `batch_size` rows are taken; how many were (in_batches' `batch`)."""
    taken = 0
    with conn.transaction():
        for table in tables:
            text = statement.replace("{table}", table)
            row = conn.execute(text, {**params, "batch_size": batch_size - taken}).fetchone()
            taken += int(row[0]) if row else 0
            if taken >= batch_size:
                break
    return taken


def atomic(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    """The transaction under way, or a new one (which names the schema)."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return conn.transaction()
    return nullcontext()


def _one(conn: QueueConnection, name: str, params: Mapping[str, Any] | None = None) -> Any:
    with atomic(conn):
        row = conn.execute(query(name), dict(params or {})).fetchone()
    assert row is not None  # these queries return exactly one row
    return row


def read_only_message(conn: QueueConnection) -> str:
    return (
        f"the server at {conn.where} is a read-only standby: "
        "point --dsn (or PGQCTL_DSN) at the primary"
    )


def explain(exc: psycopg.Error, conn: QueueConnection) -> Exception | None:
    """The error pgqctl means, for a server error a deployment causes (a
    standby, a missing GRANT); None for any other."""
    if exc.sqlstate == READ_ONLY_SQLSTATE:
        return ReadOnlyServer(read_only_message(conn))
    if exc.sqlstate == PRIVILEGE_SQLSTATE:
        return PrivilegeMissing(privilege_message(conn, error=reason(exc)))
    return None


def shares_server_connections(
    conn: QueueConnection, other: QueueConnection, rounds: int = 10
) -> bool:
    """Whether the pooler in front of both connections hands a server
    connection to another client between transactions (transaction pooling),
    found without leaving anything behind on the server connections.

    A session pooler keeps `conn` on one server connection, which no other
    client ever gets. A transaction pooler hands `conn`'s to the next client
    that starts a transaction, `other` if it comes at once (PgBouncer reuses
    the last freed first), or gives `conn` another one next time; a few
    rounds see either happen, even on a busy pool.
    """
    (mine,) = _one(conn, "server_backend")
    for _ in range(rounds):
        (theirs,) = _one(other, "server_backend")
        (again,) = _one(conn, "server_backend")
        if theirs == mine or again != mine:
            return True
    return False


def require_primary(conn: QueueConnection) -> None:
    """Raise ReadOnlyServer on a standby (or a server that only reads)."""
    (recovering, read_only) = _one(conn, "server_read_only")
    if recovering or read_only:
        raise ReadOnlyServer(read_only_message(conn))


def require_migrated(conn: QueueConnection) -> None:
    """Raise NotMigrated unless this pgqctl can use the schema, or
    PrivilegeMissing when this role may not see the queue.

    The rule (docs/operating.md: Upgrades): every migration this pgqctl knows must be
    applied, and the schema's oldest client (the last breaking migration
    applied, see pgqctl/migrate.py) must be one this pgqctl knows. Migrations
    newer than this pgqctl that are additive for it do not stop it."""
    schema = conn.schema
    run_migrate = f"run `{migrate_command(schema)}`"
    state = _one(conn, "schema_state", {"schema": schema})
    exists, usage, recorded, jobs, readable, logged = state
    if exists and not usage:
        raise PrivilegeMissing(
            f"role {conn.role} may not use schema {schema}: "
            f"an owner of the queue can run `GRANT USAGE ON SCHEMA {_ident(conn, schema)} "
            f"TO {_ident(conn, conn.role)}` (see docs/operating.md, Roles)"
        )
    if jobs and not recorded:
        # `migrate` would refuse to touch it: saying "run migrate" would not help.
        raise NotMigrated(
            f"schema {schema} has a jobs relation that pgqctl did not create: "
            "use --schema to name the queue's schema (`pgqctl migrate --schema NAME` makes one)"
        )
    if recorded and not jobs:
        # `migrate` would find every migration applied and do nothing.
        raise NotMigrated(
            f"schema {schema} records pgqctl migrations but has no jobs table (dropped?): "
            f"drop its pgqctl_migrations and pgqctl_migration_log tables too, then {run_migrate}"
        )
    if not recorded:
        raise NotMigrated(f"no pgqctl queue in schema {schema}: {run_migrate}")
    if not readable:
        table = "pgqctl_migration_log" if logged else "pgqctl_migrations"
        raise PrivilegeMissing(privilege_message(conn, table))
    applied, serves_from = _one(conn, "schema_version" if logged else "schema_version_legacy")
    known = [m.name for m in migrations()]
    behind = set(known) - set(applied)
    if behind:
        raise NotMigrated(f"schema {schema} is {len(behind)} migration(s) behind: {run_migrate}")
    if serves_from is not None and serves_from not in known:
        raise NotMigrated(
            f"schema {schema} was migrated by a newer pgqctl whose migration {serves_from} "
            "changes what older ones rely on: upgrade pgqctl to use it"
        )


def migrate_command(schema: str) -> str:
    """The `pgqctl migrate` that serves `schema`, to paste into a shell."""
    if schema == "public":
        return "pgqctl migrate"
    return f"pgqctl migrate --schema {shlex.quote(schema)}"


def _ident(conn: psycopg.Connection[Any], name: str | None) -> str:
    # Without the connection: it may be closed by the time an error is explained.
    return sql.Identifier(name or "").as_string(None)


_DENIED_ON = re.compile(r"permission denied for (?:table|relation|sequence) (\w+)")


def privilege_message(conn: QueueConnection, table: str | None = None, error: str = "") -> str:
    """What to GRANT so that this role may use the queue's tables."""
    if table is None:
        found = _DENIED_ON.search(error)
        table = found.group(1) if found else "jobs"
    schema = _ident(conn, conn.schema)
    role = _ident(conn, conn.role)
    what = f"{error}: " if error else f"role {conn.role} may not read {table}: "
    return (
        f"{what}an owner of the queue can run `GRANT SELECT, INSERT, UPDATE, DELETE "
        f"ON ALL TABLES IN SCHEMA {schema} TO {role}` (or only SELECT, for a role that "
        "just watches; see docs/operating.md, Roles)"
    )
