"""`pgqctl reap` as an operator runs it: what it reclaims, its dry run, the workers it wakes."""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired, snapshot


def sql_case_attempts() -> Any:
    from psycopg import sql

    # First job attempt 1 of 3, second attempt 3 of 3.
    return sql.SQL("CASE WHEN generate_series = 1 THEN 1 ELSE 3 END")


# --- formats --------------------------------------------------------------------------

ISO_MS_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def test_reap_dry_run_shows_the_outcome_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    retry, dead = expired(conn, 2, attempts=sql_case_attempts())
    before = snapshot(conn)
    preview = cli_json(dsn, "reap", "--dry-run")
    assert [(j["id"], j["status"], j["held_by"]) for j in preview] == [
        (retry, "pending", "host:1:0"),
        (dead, "failed", "host:1:0"),
    ]
    assert snapshot(conn) == before

    plain = run_cli("reap", "--dry-run", "--format", "plain", "--dsn", dsn)
    assert "would reap 2 expired leases: 1 back to pending, 1 failed" in plain.stderr


def test_reap_says_what_it_did_and_records_the_holder(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = expired(conn, locked_by="web-1:42:3")
    result = run_cli("reap", "--format", "plain", "--dsn", dsn)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[2].split()[:5] == [
        str(job_id),
        "default",
        "test",
        "pending",
        "1/3",
    ]
    assert "reaped 1 expired lease: 1 back to pending, 0 failed" in result.stderr
    row = conn.execute(
        "SELECT last_error, locked_by, locked_until FROM jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None and "(held by web-1:42:3)" in row[0]
    # The lease is gone; who last held it stays on the job.
    assert row[1:] == ("web-1:42:3", None)


def test_reap_with_nothing_expired_exits_0(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, status="running", attempts=1, locked_until=ago("-5 minutes"))
    result = run_cli("reap", "--dsn", dsn)
    assert (result.exit_code, result.stdout) == (0, "")
    assert result.stderr == "pgqctl: no expired leases\n"
    assert cli_json(dsn, "reap") == []

    quiet = run_cli("reap", "--quiet", "--json", "--dsn", dsn)
    assert (quiet.exit_code, quiet.stdout, quiet.stderr) == (0, "", "")

    expired(conn)
    changed = run_cli("reap", "--quiet", "--json", "--dsn", dsn)
    assert changed.exit_code == 0 and changed.stderr == ""
    assert len(json.loads(changed.stdout)) == 1


def test_reap_and_requeue_wake_listening_workers(dsn: str, conn: psycopg.Connection[Any]) -> None:
    expired(conn)
    add_jobs(conn, status="failed", attempts=3)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqctl_jobs")
        assert run_cli("reap", "--dsn", dsn).exit_code == 0
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["public"]
        assert run_cli("requeue", "--failed", "--dsn", dsn).exit_code == 0
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["public"]


def test_reap_writes_iso_times_and_its_dry_run_shows_the_same_error(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = expired(conn, locked_by="web-1:42:3")
    conn.execute(
        "UPDATE jobs SET locked_until = '2026-11-30 14:21:04.382917+00' WHERE id = %s", (job_id,)
    )
    (bare,) = add_jobs(conn, status="running", attempts=3, locked_by="web-2:7:0")
    # In UTC whatever the session's time zone.
    zoned = run_cli(
        "reap",
        "--dry-run",
        "--json",
        "--dsn",
        dsn,
        env={"PGOPTIONS": "-c TimeZone=America/New_York"},
    )
    assert zoned.exit_code == 0, zoned.stderr
    preview = json.loads(zoned.stdout)
    assert [(j["id"], j["status"], j["last_error"]) for j in preview] == [
        (bare, "failed", "running without a lease (held by web-2:7:0)"),
        (job_id, "pending", "lease expired at 2026-11-30T14:21:04.382Z (held by web-1:42:3)"),
    ]
    reaped = {j["id"]: j["last_error"] for j in cli_json(dsn, "reap")}
    assert reaped == {j["id"]: j["last_error"] for j in preview}
    stored = conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()
    assert stored is not None and re.fullmatch(
        rf"lease expired at {ISO_MS_UTC} \(held by web-1:42:3\)", stored[0]
    )
