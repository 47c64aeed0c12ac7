"""Create jobs the way a producer may, plain SQL INSERTs, and read them back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.conftest import run_cli


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


def mixed_queues(conn: psycopg.Connection[Any]) -> None:
    """Two queues with jobs in every status, some recent, some old, two leases expired."""
    add_jobs(conn, 4, queue="emails", run_at=ago("1 hour"))
    add_jobs(conn, 2, queue="emails", status="done", attempts=1, finished_at=ago("10 seconds"))
    add_jobs(conn, 5, queue="emails", status="done", attempts=1, finished_at=ago("5 minutes"))
    add_jobs(conn, 1, queue="sms", status="failed", attempts=3, finished_at=ago("30 seconds"))
    add_jobs(conn, 2, queue="sms", status="failed", attempts=3, finished_at=ago("2 hours"))
    expired(conn, 2, queue="sms")
    add_jobs(conn, 1, queue="sms", status="running", attempts=1, locked_until=ago("-5 minutes"))


def insert_jobs(
    conn: psycopg.Connection[Any],
    payloads: list[object],
    *,
    kind: str = "test",
    max_attempts: int = 3,
) -> list[int]:
    """One pending job per payload, in order; their ids in the same order."""
    rows = conn.execute(
        "INSERT INTO jobs (kind, payload, max_attempts) "
        "SELECT %s, p, %s FROM unnest(%s::jsonb[]) WITH ORDINALITY AS t(p, n) "
        "ORDER BY n RETURNING id",
        (kind, max_attempts, [json.dumps(p) for p in payloads]),
    ).fetchall()
    return sorted(row[0] for row in rows)


def job(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM jobs WHERE id = %s", (job_id,))
    names = [d.name for d in cur.description or []]
    row = cur.fetchone()
    assert row is not None
    return dict(zip(names, row, strict=True))


def statuses(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
    return {status: count for status, count in rows}


def sh(script: str, *args: str) -> dict[str, list[str]]:
    """An argv payload running a shell script (no --allow-shell needed)."""
    return {"argv": ["sh", "-c", script, "sh", *args]}


def enqueue_file_unheard(
    dsn: str, path: Path, lines: list[str], *, producer: str | None = None
) -> tuple[Any, list[Any]]:
    """Write `lines` to `path`, load it with `pgqctl enqueue --file` as
    `producer` (else `dsn`), and return the CLI's result and the wake-ups a
    listener on `dsn` heard: a load that fails must wake nobody."""
    path.write_text("\n".join(lines) + "\n")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqctl_jobs")
        result = run_cli("enqueue", "--file", str(path), "--dsn", producer or dsn)
        return result, list(listener.notifies(timeout=0.5))
