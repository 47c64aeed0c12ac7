"""`pgqctl purge` as an operator runs it: finished jobs deleted in batches."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired


def test_purge_deletes_old_done_rows_in_batches_and_nothing_else(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 25, status="done", attempts=1, finished_at=ago("8 days"))
    recent = add_jobs(conn, 2, status="done", attempts=1)
    failed = add_jobs(conn, 3, status="failed", attempts=3, finished_at=ago("8 days"))
    live = add_jobs(conn, 4) + expired(conn, 2)

    dry = cli_json(dsn, "purge", "--older-than", "7d", "--dry-run")
    assert dry == {"deleted": 0, "dry_run": True, "matched": 25}

    result = run_cli("purge", "--older-than", "7d", "--batch-size", "7", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": 25}
    assert "deleted 25 done jobs finished more than 7d00h ago" in result.stderr
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(recent + failed + live)

    assert cli_json(dsn, "purge", "--status", "failed") == {"deleted": 3}
    assert cli_json(dsn, "purge", "--status", "all") == {"deleted": 2}
    remaining = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert remaining == sorted(live)


def attempt_rows(conn: psycopg.Connection[Any]) -> list[tuple[int, int]]:
    return conn.execute("SELECT job_id, claim FROM attempts ORDER BY 1, 2").fetchall()


def add_attempts(conn: psycopg.Connection[Any], job_id: int, *ended_ago: str) -> None:
    """Attempts of `job_id`, claim 1, 2, ..., each ended so long ago."""
    for claim, ago_text in enumerate(ended_ago, start=1):
        conn.execute(
            "INSERT INTO attempts (job_id, claim, attempt, outcome, finished_at, recorded_by, "
            "stdout_tail) VALUES (%s, %s, %s, 'failed', now() - %s::interval, 'worker', "
            "repeat('x', 65536))",
            (job_id, claim, claim, ago_text),
        )


def test_a_jobs_attempts_go_with_it_and_have_a_retention_of_their_own(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (old,) = add_jobs(conn, status="done", attempts=2, finished_at=ago("8 days"))
    (retried,) = add_jobs(conn, status="done", attempts=3, finished_at=ago("1 hour"))
    (live,) = add_jobs(conn, attempts=2)
    add_attempts(conn, old, "8 days", "8 days")
    add_attempts(conn, retried, "5 days", "4 days", "1 hour")
    add_attempts(conn, live, "6 days", "1 minute")

    # Alone, --attempts-older-than deletes attempts, never a job.
    dry = cli_json(dsn, "purge", "--attempts-older-than", "3d", "--dry-run")
    assert dry == {"deleted": 0, "dry_run": True, "attempts_matched": 5}
    result = run_cli("purge", "--attempts-older-than", "3d", "--batch-size", "2", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert "deleted 5 attempts ended more than 3d00h ago" in result.stderr
    assert attempt_rows(conn) == [(retried, 3), (live, 2)]
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (3,)

    # A job purged takes its attempts with it; both at once when both are asked.
    add_attempts(conn, old, "8 days")
    both = cli_json(dsn, "purge", "--older-than", "7d", "--attempts-older-than", "30m")
    assert both == {"deleted": 1, "attempts_deleted": 1}
    assert attempt_rows(conn) == [(live, 2)]
    assert [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")] == [retried, live]


def test_purge_rests_between_batches_as_told(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 10, status="done", attempts=1, finished_at=ago("1 day"))

    began = time.monotonic()
    result = run_cli("purge", "--batch-size", "4", "--pause", "0.4s", "--json", "--dsn", dsn)
    took = time.monotonic() - began
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": 10}
    # Two full batches, each followed by a rest; the third (2 rows) ends it.
    assert took >= 0.8

    bad = run_cli("purge", "--pause", "soon", "--dsn", dsn)
    assert bad.exit_code == 2
    assert "--pause" in bad.stderr and "Traceback" not in bad.stderr


def test_purge_by_default_paces_itself_and_still_deletes_everything(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 30, status="done", attempts=1, finished_at=ago("1 day"))
    assert cli_json(dsn, "purge", "--batch-size", "7") == {"deleted": 30}
    assert cli_json(dsn, "purge", "--batch-size", "7", "--pause", "auto") == {"deleted": 0}
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
