"""Create jobs the way a producer may: plain SQL INSERTs."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql


def add_jobs(conn: psycopg.Connection[Any], n: int = 1, **columns: Any) -> list[int]:
    """Insert `n` jobs with these column values (SQL expressions via `sql.SQL`)."""
    values = {"kind": "test", "payload": json.dumps({"argv": ["true"]}), **columns}
    names = sql.SQL(", ").join(sql.Identifier(c) for c in values)
    exprs = sql.SQL(", ").join(
        v if isinstance(v, sql.Composable) else sql.Literal(v) for v in values.values()
    )
    query = sql.SQL("INSERT INTO jobs ({}) SELECT {} FROM generate_series(1, {}) RETURNING id")
    rows = conn.execute(query.format(names, exprs, sql.Literal(n))).fetchall()
    return [r[0] for r in rows]


def ago(text: str) -> sql.Composable:
    """`now() - interval '<text>'`, e.g. ago('5 minutes')."""
    return sql.SQL("now() - {}::interval").format(sql.Literal(text))


def expired(conn: psycopg.Connection[Any], n: int = 1, **columns: Any) -> list[int]:
    """Running jobs whose lease ended five minutes ago."""
    defaults = {
        "status": "running",
        "attempts": 1,
        "locked_until": ago("5 minutes"),
        "locked_by": "host:1:0",
    }
    return add_jobs(conn, n, **{**defaults, **columns})


def snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """Every row, to show that a command wrote nothing."""
    return conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()
