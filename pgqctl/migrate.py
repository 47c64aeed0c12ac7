"""Plan, apply and check the schema migrations.

Each file under sql/migrations/ runs in its own transaction and is recorded
in `pgqctl_migrations` with its checksum. Each of those transactions first
takes an advisory lock on the schema, held until it ends (never left behind,
even through a transaction pooler), and checks again what is applied: four
`pgqctl migrate` started at once apply the schema once and all succeed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgqctl.db import atomic
from pgqctl.errors import MigrationError, PrivilegeMissing
from pgqctl.sql import Migration, migrations, query

# First key of the two-key advisory lock; the second is the schema's hash.
_LOCK_KEY = 0x70677163  # "pgqc"


@dataclass(frozen=True)
class MigrationState:
    name: str
    status: str  # applied, pending or changed
    applied_at: dt.datetime | None


def status(conn: psycopg.Connection[Any], schema: str) -> list[MigrationState]:
    """Every known migration with whether it is applied, pending or changed,
    then any applied by a newer pgqctl ("unknown")."""
    with _snapshot(conn):
        applied = _applied(conn, schema)
        _refuse_foreign_jobs_table(conn, schema, applied)
    states = []
    for m in migrations():
        if m.name not in applied:
            states.append(MigrationState(m.name, "pending", None))
        else:
            checksum, applied_at = applied[m.name]
            state = "applied" if checksum == m.checksum else "changed"
            states.append(MigrationState(m.name, state, applied_at))
    for name in _unknown(applied):
        states.append(MigrationState(name, "unknown", applied[name][1]))
    return states


def pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    """Migrations still to apply; refuses when an applied one has changed."""
    # One snapshot for both reads: a migrate committing in between must not make
    # its new jobs table look like one pgqctl did not create.
    with _snapshot(conn):
        return _pending(conn, schema)


def _pending(conn: psycopg.Connection[Any], schema: str) -> list[Migration]:
    applied = _applied(conn, schema)
    _refuse_changed(applied)
    _refuse_newer(applied, schema)
    _refuse_foreign_jobs_table(conn, schema, applied)
    return [m for m in migrations() if m.name not in applied]


@contextmanager
def _snapshot(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction whose reads all see one snapshot (REPEATABLE READ)."""
    level = conn.isolation_level
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with conn.transaction():
            yield
    finally:
        conn.isolation_level = level


def apply(
    conn: psycopg.Connection[Any],
    schema: str,
    on_applied: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply what is pending, each migration in its own transaction under
    the schema's lock."""
    done: list[Migration] = []
    while True:
        with conn.transaction():  # READ COMMITTED: each read sees what committed before it
            conn.execute(query("migrate_lock"), {"key": _LOCK_KEY, "schema": schema})
            # Checked again under the lock: another run may have just applied it.
            todo = _pending(conn, schema)
            if not todo:
                return done
            migration = todo[0]
            _create_bookkeeping(conn, schema)
            conn.execute(migration.text.encode("utf-8"))
            conn.execute(
                query("migration_record"),
                {"name": migration.name, "checksum": migration.checksum},
            )
        done.append(migration)
        if on_applied:
            on_applied(migration)


def _applied(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, dt.datetime]]:
    with atomic(conn):
        params = {"schema": schema}
        found = conn.execute(query("migrations_table_exists"), params).fetchone()
        if not found:
            return {}
        readable, role = found
        if not readable:
            # Its columns would look missing, as if another program made it.
            name = sql.Identifier(schema, "pgqctl_migrations").as_string(None)
            raise PrivilegeMissing(
                f"role {role} may not read {name}, which the queue's migrations are kept in: "
                f"run migrate as the role that owns the queue's tables, or have it run "
                f"`GRANT SELECT ON {name} TO {sql.Identifier(role).as_string(None)}`"
            )
        columns = {row[0] for row in conn.execute(query("migrations_table_columns"), params)}
        if not {"name", "checksum", "applied_at"} <= columns:
            raise MigrationError(
                f"schema {schema} has a pgqctl_migrations table that pgqctl did not create; "
                "left it untouched: use --schema to put the queue in another schema"
            )
        rows = conn.execute(query("migrations_applied")).fetchall()
    return {name: (checksum, applied_at) for name, checksum, applied_at in rows}


def _refuse_changed(applied: dict[str, tuple[str, dt.datetime]]) -> None:
    for m in migrations():
        if m.name in applied and applied[m.name][0] != m.checksum:
            raise MigrationError(
                f"migration {m.name} was applied but its file has changed since: "
                "restore the original file (migrations are forward-only; add a new one)"
            )


def _unknown(applied: dict[str, tuple[str, dt.datetime]]) -> list[str]:
    """Applied migrations this pgqctl has no file for: a newer one applied them."""
    return sorted(set(applied) - {m.name for m in migrations()})


def _refuse_newer(applied: dict[str, tuple[str, dt.datetime]], schema: str) -> None:
    unknown = _unknown(applied)
    if unknown:
        raise MigrationError(
            f"schema {schema} was migrated by a newer pgqctl ({', '.join(unknown)} "
            "applied, unknown to this one): upgrade pgqctl"
        )


def _refuse_foreign_jobs_table(
    conn: psycopg.Connection[Any], schema: str, applied: dict[str, tuple[str, dt.datetime]]
) -> None:
    if applied:
        return
    # Any relation of that name would collide: a table, a view, a sequence...
    with atomic(conn):
        row = conn.execute(query("jobs_relation_kind"), {"schema": schema}).fetchone()
    if row:
        what = _RELATION_KINDS.get(row[0], "relation")
        raise MigrationError(
            f"schema {schema} already has a {what} named jobs that pgqctl did not create; "
            "left it untouched: use --schema to put the queue in another schema"
        )


_RELATION_KINDS = {
    "r": "table",
    "p": "table",
    "v": "view",
    "m": "materialized view",
    "f": "foreign table",
    "S": "sequence",
    "i": "index",
    "I": "index",
    "c": "type",
}


def _create_bookkeeping(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema and the bookkeeping table, in the migration's transaction."""
    if not conn.execute(query("schema_exists"), {"schema": schema}).fetchone():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    conn.execute(query("migrations_create"))
