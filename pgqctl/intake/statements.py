"""Every statement sent on the caller's connection, and the cursor it goes through.

Nothing here is prepared, whatever the connection's prepare_threshold: the
caller's connection may go through a transaction pooler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqctl.sql import query

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


def cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[tuple[Any, ...]]:
    """A cursor on the caller's connection that gives tuples, whatever row
    factory the caller chose for the connection."""
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row)


def run(cur: psycopg.Cursor[Any], statement: str | sql.Composed, params: Any = None) -> None:
    """Every statement on the caller's connection goes through here: never as
    a prepared statement, whatever the connection's prepare_threshold.

    Behind a transaction pooler (PgBouncer before 1.21), a statement psycopg
    prepares stays on the server connection under a name such as _pg3_0, and
    another client given that server connection runs it when it executes its
    own _pg3_0: a job inserted into the other client's schema, or an error.
    """
    cur.execute(statement, params, prepare=False)


def jobs_table(schema: str | None) -> sql.Identifier:
    from psycopg import sql

    return sql.Identifier("jobs") if schema is None else sql.Identifier(schema, "jobs")


def statement(name: str, table: sql.Identifier) -> sql.Composed:
    from psycopg import sql

    return sql.SQL(query(name)).format(jobs=table)
