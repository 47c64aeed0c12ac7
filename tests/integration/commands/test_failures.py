"""`pgqctl failures`: 20,000 failed jobs read as the few causes behind them."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago


def failed(conn: psycopg.Connection[Any], n: int, kind: str, error: Any, **columns: Any) -> None:
    add_jobs(
        conn,
        n,
        kind=kind,
        status="failed",
        attempts=3,
        finished_at=ago("1 minute"),
        last_error=error,
        **columns,
    )


def test_twenty_thousand_failures_read_as_their_causes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) "
        "SELECT 'invoice', '{}', 'failed', 3, now() - g * interval '1 second', "
        "E'exit status 1\\nTraceback (most recent call last):\\n  ...\\n"
        "ValueError: invoice ' || g || E' has no customer\\n\\n' "
        "FROM generate_series(1, 20000) AS g"
    )
    failed(conn, 30, "mail", "timed out after 30s")
    failed(conn, 5, "mail", "exit status 75\nsmtp: connection refused by 10.0.0.7")
    failed(conn, 4, "mail", "exit status 2\nsmtp: connection refused by 10.0.0.9")
    failed(
        conn,
        2,
        "mail",
        "payload refused: job 0b9f1c2e-5d1a-4c47-9a8e-3f0c1b2a4d5e names a program not allowed",
    )
    add_jobs(conn, 3, kind="mail", status="pending", last_error="exit status 1\nnot failed yet")

    causes = cli_json(dsn, "failures")
    assert [(c["kind"], c["jobs"], c["pattern"]) for c in causes] == [
        ("invoice", 20000, "exit status 1: ValueError: invoice N has no customer"),
        ("mail", 30, "timed out after Ns"),
        ("mail", 5, "exit status 75: smtp: connection refused by N.N.N.N"),
        ("mail", 4, "exit status 2: smtp: connection refused by N.N.N.N"),
        ("mail", 2, "payload refused: job U names a program not allowed"),
    ]
    invoice = causes[0]
    assert invoice["example"] == "exit status 1: ValueError: invoice 1 has no customer"
    assert invoice["first_seen"] < invoice["last_seen"]
    shown = run_cli("show", str(invoice["example_id"]), "--json", "--dsn", dsn)
    assert "invoice 1 has no customer" in shown.stdout

    table = run_cli("failures", "--limit", "2", "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["jobs", "kind", "cause", "first_seen", "last_seen", "example_id"]
    assert lines[2].split()[:2] == ["20000", "invoice"] and len(lines) == 4
    assert table.stderr.splitlines() == [
        "pgqctl: 20041 failed jobs",
        "pgqctl: 11 of them in causes left out; --limit to see more",
    ]


def test_failures_narrow_by_kind_queue_and_time(dsn: str, conn: psycopg.Connection[Any]) -> None:
    failed(conn, 2, "pdf", "exit status 1\nout of paper", queue="print")
    failed(conn, 3, "mail", "exit status 1\nout of paper")
    add_jobs(
        conn,
        4,
        kind="pdf",
        status="failed",
        queue="print",
        finished_at=ago("2 days"),
        last_error="exit status 1\nout of paper",
    )
    assert [c["jobs"] for c in cli_json(dsn, "failures", "--kind", "pdf")] == [6]
    assert [c["jobs"] for c in cli_json(dsn, "failures", "--kind", "pdf", "--since", "1d")] == [2]
    assert [c["kind"] for c in cli_json(dsn, "failures", "--queue", "default")] == ["mail"]
    none = run_cli("failures", "--kind", "nothing", "--dsn", dsn)
    assert none.exit_code == 0 and none.stderr == "pgqctl: 0 failed jobs\n"


def test_list_and_requeue_select_by_error_text(dsn: str, conn: psycopg.Connection[Any]) -> None:
    failed(conn, 2, "mail", "exit status 75\nsmtp: Connection refused")
    failed(conn, 1, "mail", "timed out after 30s")
    failed(conn, 1, "mail", "exit status 1\n50%_done then died")
    listed = cli_json(dsn, "list", "--status", "failed", "--error", "CONNECTION REFUSED")
    assert len(listed) == 2
    # Not a pattern: % and _ are themselves.
    assert len(cli_json(dsn, "list", "--error", "50%_done")) == 1
    assert cli_json(dsn, "list", "--error", "5%done") == []

    moved = cli_json(dsn, "requeue", "--error", "connection refused")
    assert {j["status"] for j in moved} == {"pending"} and len(moved) == 2
    assert [c["jobs"] for c in cli_json(dsn, "failures")] == [1, 1]

    empty = run_cli("list", "--error", "", "--dsn", dsn)
    assert empty.exit_code == 2 and "give the text to look for" in empty.stderr


def test_failures_at_times_no_datetime_holds_read_as_postgresql_wrote_them(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Plain SQL may finish a job at '-infinity': it is shown as written, in
    # text and in JSON, not as a traceback.
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) "
        "VALUES ('far', '{}', 'failed', 1, '-infinity', 'boom'), "
        "       ('far', '{}', 'failed', 1, 'infinity', 'boom')"
    )
    (cause,) = cli_json(dsn, "failures")
    assert (cause["first_seen"], cause["last_seen"], cause["jobs"]) == ("-infinity", "infinity", 2)
    shown = run_cli("failures", "--dsn", dsn)
    assert shown.exit_code == 0 and "-infinity" in shown.stdout, shown.stderr
