"""`pgqctl leases` as an operator runs it: who holds each running job, and
which leases have expired.
"""

from __future__ import annotations

from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired


def test_leases_human_table_shows_holder_and_time_left(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (late,) = expired(conn, kind="resize", locked_by="web-1:42:0")
    (fine,) = add_jobs(
        conn, status="running", attempts=2, locked_until=ago("-10 minutes"), locked_by="web-2:7:1"
    )
    result = run_cli("leases", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0
    header, _, first, second = result.stdout.splitlines()
    assert header.split() == ["id", "queue", "kind", "attempt", "locked_by", "locked_until", "left"]
    assert first.split()[:5] == [str(late), "default", "resize", "1/3", "web-1:42:0"]
    assert first.split()[-1].startswith("-5m")
    assert second.split()[0] == str(fine) and second.split()[-1].startswith("9m")

    only = run_cli("leases", "--expired", "--format", "plain", "--dsn", dsn)
    assert len(only.stdout.splitlines()) == 3

    conn.execute("DELETE FROM jobs")
    none = run_cli("leases", "--expired", "--dsn", dsn)
    assert none.exit_code == 0 and none.stdout == ""
    assert "no expired leases" in none.stderr


def test_a_running_job_without_a_lease_counts_as_expired_and_is_reaped(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Only plain SQL makes one; nothing but reap could ever free it.
    (bare,) = add_jobs(conn, status="running", attempts=1, locked_by="web-1:42:0")
    (held,) = add_jobs(conn, status="running", attempts=1, locked_until=ago("-10 minutes"))
    assert cli_json(dsn, "stats")["expired_leases"] == 1
    assert [(j["id"], j["expired"]) for j in cli_json(dsn, "leases")] == [
        (bare, True),
        (held, False),
    ]
    assert [j["id"] for j in cli_json(dsn, "leases", "--expired")] == [bare]
    table = run_cli("leases", "--format", "plain", "--dsn", dsn).stdout.splitlines()
    assert table[2].split()[0] == str(bare) and table[2].endswith("no lease")
    assert [j["id"] for j in cli_json(dsn, "reap", "--dry-run")] == [bare]
    assert [j["id"] for j in cli_json(dsn, "reap")] == [bare]
    row = conn.execute("SELECT status, last_error FROM jobs WHERE id = %s", (bare,)).fetchone()
    assert row == ("pending", "running without a lease (held by web-1:42:0)")
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (held,)).fetchone() == ("running",)
