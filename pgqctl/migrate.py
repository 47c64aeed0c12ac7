"""Plan, apply and check the schema migrations.

Each file under sql/migrations/ runs in its own transaction and is recorded
in `pgqctl_migrations` with its checksum. Concurrent runs serialize on an
advisory lock per schema, so four `pgqctl migrate` started at once apply the
schema once and all succeed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgqctl.errors import MigrationError
from pgqctl.sql import Migration, migrations

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
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        applied = _applied(conn, schema)
        _refuse_changed(applied)
        _refuse_newer(applied, schema)
        _refuse_foreign_jobs_table(conn, schema, applied)
    return [m for m in migrations() if m.name not in applied]


def apply(
    conn: psycopg.Connection[Any],
    schema: str,
    on_applied: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply what is pending, under the schema's advisory lock."""
    conn.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (_LOCK_KEY, schema))
    try:
        # Checked again under the lock: another run may have just finished.
        todo = pending(conn, schema)
        if todo:
            _create_bookkeeping(conn, schema)
        for m in todo:
            with conn.transaction():
                conn.execute(m.text.encode("utf-8"))
                conn.execute(
                    "INSERT INTO pgqctl_migrations (name, checksum) VALUES (%s, %s)",
                    (m.name, m.checksum),
                )
            if on_applied:
                on_applied(m)
        return todo
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (_LOCK_KEY, schema))


def _applied(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[str, dt.datetime]]:
    exists = conn.execute(
        "SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'pgqctl_migrations'",
        (schema,),
    ).fetchone()
    if not exists:
        return {}
    columns = {
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'pgqctl_migrations'",
            (schema,),
        )
    }
    if not {"name", "checksum", "applied_at"} <= columns:
        raise MigrationError(
            f"schema {schema} has a pgqctl_migrations table that pgqctl did not create; "
            "left it untouched: use --schema to put the queue in another schema"
        )
    rows = conn.execute("SELECT name, checksum, applied_at FROM pgqctl_migrations").fetchall()
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
    row = conn.execute(
        "SELECT c.relkind FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'jobs'",
        (schema,),
    ).fetchone()
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
    with conn.transaction():
        has_schema = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
        if not has_schema:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(
            """
            CREATE TABLE IF NOT EXISTS pgqctl_migrations (
                name       text PRIMARY KEY,
                checksum   text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
