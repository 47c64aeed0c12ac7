"""`worker --sql KIND=STATEMENT`: a job's statement and its "done" in one transaction.

Real workers against a real PostgreSQL; the statements write to a table of
their own, so every assertion reads what a user would: rows committed or not.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job
from tests.support.processes import PgqctlProcess, start_worker, wait_until

__all__ = ["start_worker"]  # the fixture, used by name

# Writes a note, then sleeps as the payload says, then fails if it says so:
# every part of the work in the job's one transaction.
NOTE = "note=SELECT note($1::jsonb)"


@pytest.fixture
def notes(conn: psycopg.Connection[Any]) -> Callable[[], list[int]]:
    conn.execute("CREATE TABLE notes (n bigint NOT NULL)")
    conn.execute(
        """
        CREATE FUNCTION note(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO notes VALUES ((p ->> 'n')::bigint);
            PERFORM pg_sleep(coalesce((p ->> 'sleep')::float8, 0));
            IF (p ->> 'fail')::bool THEN
                RAISE EXCEPTION 'note % refused', p ->> 'n' USING ERRCODE = 'P0042';
            END IF;
        END $$
        """
    )
    return lambda: [r[0] for r in conn.execute("SELECT n FROM notes ORDER BY 1")]


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines()]


def test_statement_and_done_commit_together_a_failure_rolls_both_back(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]]
) -> None:
    ok = insert_jobs(conn, [{"n": 1}, {"n": 2}], kind="note")
    [bad] = insert_jobs(conn, [{"n": 3, "fail": True}], kind="note", max_attempts=2)
    result = run_cli(
        "worker", "--dsn", dsn, "--burst", "--sql", NOTE, "--backoff", "0.1s",
        "--log-format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    for job_id in ok:
        row = job(conn, job_id)
        assert (row["status"], row["attempts"], row["last_error"]) == ("done", 1, None)
    # The failing one wrote its note twice, and twice the note rolled back:
    # its retry, due 0.1 s after the first try, ran before the worker exited.
    row = job(conn, bad)
    assert (row["status"], row["attempts"]) == ("failed", 2)
    assert row["last_error"] == "SQL error P0042: note 3 refused"
    assert notes() == [1, 2]
    [failed] = [e for e in events(result.stderr) if e["event"] == "failed"]
    assert failed["error"] == "SQL error P0042: note 3 refused"
    started = [e for e in events(result.stderr) if e["event"] == "started"]
    assert started and all(isinstance(e["backend_pid"], int) for e in started)


def test_statements_that_cannot_run_are_refused_before_any_job(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    [job_id] = insert_jobs(conn, [{"n": 1}], kind="k")
    conn.execute("CREATE PROCEDURE by_id(id bigint) LANGUAGE sql AS $$ SELECT 1 $$")
    cases = [
        (
            "k=SELEC 1",
            '--sql k=...: the statement does not prepare: syntax error at or near "SELEC"',
        ),
        ("k=SELECT $1::int + $2::int", "--sql k=...: the statement takes 2 parameters"),
        ("k=CALL by_id($1)", "--sql k=...: $1 is bigint, but it is the job's payload"),
        ("k=SELECT * FROM no_such_table", 'relation "no_such_table" does not exist'),
        ("k", "'k' is not KIND=STATEMENT"),
    ]
    for spec, said in cases:
        result = run_cli("worker", "--dsn", dsn, "--burst", "--sql", spec)
        assert result.exit_code == 2, (spec, result.stderr)
        assert said in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) <= 3, result.stderr  # usage line + error
    result = run_cli(
        "worker", "--dsn", dsn, "--burst", "--sql", "k=SELECT 1", "--handler", "k=true"
    )
    assert result.exit_code == 2
    assert "kind 'k' has both a --handler and a --sql: give it one of them" in result.stderr
    assert job(conn, job_id)["status"] == "pending"  # nothing claimed


def test_a_statement_without_the_payload_and_one_taking_it_as_text(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]]
) -> None:
    [plain] = insert_jobs(conn, [{"n": 5}], kind="plain")
    [text] = insert_jobs(conn, [{"n": 6}], kind="text")
    result = run_cli(
        "worker", "--dsn", dsn, "--burst",
        "--sql", "plain=INSERT INTO notes VALUES (7)",
        "--sql", "text=INSERT INTO notes SELECT (($1::text)::jsonb ->> 'n')::bigint",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert job(conn, plain)["status"] == job(conn, text)["status"] == "done"
    assert notes() == [6, 7]


def test_the_jobs_timeout_is_the_statements(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]]
) -> None:
    [job_id] = insert_jobs(conn, [{"n": 1, "sleep": 30}], kind="note", max_attempts=1)
    began = time.monotonic()
    result = run_cli("worker", "--dsn", dsn, "--burst", "--sql", NOTE, "--timeout", "1s")
    assert result.exit_code == 0, result.stderr
    assert time.monotonic() - began < 20
    row = job(conn, job_id)
    assert (row["status"], row["last_error"]) == ("failed", "timed out after 1s")
    assert notes() == []


def wait_for_sleep(conn: psycopg.Connection[Any]) -> int:
    """The backend pid running the job's statement, once it sleeps."""
    found: list[int] = []

    def sleeping() -> bool:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SELECT note(%%' "
            "AND wait_event = 'PgSleep' AND datname = current_database()"
        ).fetchall()
        found[:] = [r[0] for r in rows]
        return bool(found)

    wait_until(sleeping, 10, "the job's statement to sleep")
    return found[0]


def statement_ended(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is None or row[0] == "idle"


def test_cancel_stops_the_statement_and_commits_nothing(
    conn: psycopg.Connection[Any],
    dsn: str,
    notes: Callable[[], list[int]],
    start_worker: Callable[..., PgqctlProcess],
) -> None:
    [job_id] = insert_jobs(conn, [{"n": 1, "sleep": 60}], kind="note")
    worker = start_worker(dsn, "--sql", NOTE, "--burst")
    pid = wait_for_sleep(conn)
    assert run_cli("cancel", "--dsn", dsn, "--id", str(job_id)).exit_code == 0
    wait_until(lambda: statement_ended(conn, pid), 10, "the statement to be cancelled")
    assert worker.finish() == 0
    assert job(conn, job_id)["status"] == "cancelled"
    assert notes() == []
    assert f"job {job_id} cancelled" in worker.log


def test_a_lost_lease_commits_nothing(
    conn: psycopg.Connection[Any],
    dsn: str,
    notes: Callable[[], list[int]],
    start_worker: Callable[..., PgqctlProcess],
) -> None:
    """Another worker took the job over while the statement ran: the
    statement's writes roll back with the completion that matched nothing."""
    [job_id] = insert_jobs(conn, [{"n": 1, "sleep": 2}], kind="note")
    worker = start_worker(dsn, "--sql", NOTE, "--burst", "--lease", "60s")
    wait_for_sleep(conn)
    # The lease ends and the job is claimed again (as a reap and a claim would).
    conn.execute(
        "UPDATE jobs SET attempts = attempts + 1, locked_by = 'other:1:0' WHERE id = %s",
        (job_id,),
    )
    assert worker.finish() == 0
    row = job(conn, job_id)
    assert (row["status"], row["attempts"], row["locked_by"]) == ("running", 2, "other:1:0")
    assert notes() == []
    assert f"job {job_id} lease lost: attempt 1 was claimed again (now running)" in worker.log


def test_shutdown_cancels_the_statement_after_grace_and_hands_the_job_back(
    conn: psycopg.Connection[Any],
    dsn: str,
    notes: Callable[[], list[int]],
    start_worker: Callable[..., PgqctlProcess],
) -> None:
    [job_id] = insert_jobs(conn, [{"n": 1, "sleep": 60}], kind="note")
    worker = start_worker(dsn, "--sql", NOTE, "--grace", "1s")
    pid = wait_for_sleep(conn)
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert statement_ended(conn, pid)
    row = job(conn, job_id)
    assert (row["status"], row["attempts"], row["handbacks"]) == ("pending", 1, 1)
    assert notes() == []
    assert f"job {job_id} handed back" in worker.log


def test_the_statement_runs_on_the_sessions_search_path_not_the_queues(
    conn: psycopg.Connection[Any], dsn: str, notes: Callable[[], list[int]]
) -> None:
    """A queue in its own schema: the operator's unqualified `notes` is the
    one on the connection's own search_path (public), and the job is marked
    done in the queue's schema."""
    assert run_cli("migrate", "--dsn", dsn, "--schema", "billing").exit_code == 0
    conn.execute("CREATE TABLE billing.notes (n bigint)")  # not the one meant
    [job_id] = conn.execute(
        "INSERT INTO billing.jobs (kind, payload) VALUES ('note', '{\"n\": 8}') RETURNING id"
    ).fetchone() or [0]
    result = run_cli("worker", "--dsn", dsn, "--schema", "billing", "--burst", "--sql", NOTE)
    assert result.exit_code == 0, result.stderr
    status = conn.execute("SELECT status FROM billing.jobs WHERE id = %s", (job_id,)).fetchone()
    assert status == ("done",)
    assert notes() == [8]
    assert conn.execute("SELECT count(*) FROM billing.notes").fetchone() == (0,)
