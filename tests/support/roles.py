"""Roles as docs/operating.md sets them up, made for a test and dropped after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql


@contextmanager
def app_role(conn: psycopg.Connection[Any], name: str, dsn: str) -> Iterator[str]:
    """A login role with the application role's rights on the schema public
    (USAGE, and SELECT, INSERT, UPDATE, DELETE on every table); its DSN."""
    role = sql.Identifier(name)
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(role))
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
    try:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
        conn.execute(
            sql.SQL(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
            ).format(role)
        )
        yield psycopg.conninfo.make_conninfo(dsn, user=name)
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
        conn.execute(sql.SQL("DROP ROLE {}").format(role))
