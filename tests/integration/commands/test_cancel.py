"""`pgqctl cancel` as an operator runs it: pending jobs, running jobs whose worker
is gone, selections, dry runs and what other commands make of cancelled jobs.
A running job stopped by its worker is tests/integration/worker/test_cancel.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from pgqctl import admin
from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, expired, insert_jobs, job, snapshot


def cancel_json(dsn: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    result = run_cli("cancel", "--dsn", dsn, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def assert_cancelled(
    conn: psycopg.Connection[Any], job_id: int, *, attempts: int, error: str
) -> None:
    row = job(conn, job_id)
    assert row["status"] == "cancelled"
    assert row["attempts"] == attempts
    assert row["last_error"] == error
    assert row["finished_at"] is not None
    assert row["locked_until"] is None


# -- pending and abandoned jobs --------------------------------------------------


def test_cancel_a_pending_job_at_once_and_no_worker_runs_it(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    keep, drop = insert_jobs(conn, [{"argv": ["true"]}] * 2)
    jobs, said = cancel_json(dsn, "--id", str(drop))
    assert [(j["id"], j["status"], j["cancelled_from"], j["lease_expired"]) for j in jobs] == [
        (drop, "cancelled", "pending", None)
    ]
    assert set(jobs[0]) == {*admin.FIELDS, "cancelled_from", "lease_expired"}
    assert said.strip().endswith("cancelled 1 job: 1 pending")
    assert_cancelled(conn, drop, attempts=0, error="cancelled by an operator")
    worker = subprocess.run(
        [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert job(conn, keep)["status"] == "done"
    assert_cancelled(conn, drop, attempts=0, error="cancelled by an operator")


def test_cancel_a_running_job_whose_worker_is_gone(conn: psycopg.Connection[Any], dsn: str) -> None:
    (job_id,) = expired(conn, attempts=2)
    jobs, said = cancel_json(dsn, "--id", str(job_id), "--reason", "host lost")
    assert [(j["id"], j["cancelled_from"], j["lease_expired"]) for j in jobs] == [
        (job_id, "running", True)
    ]
    assert "1 running whose worker is gone (lease expired)" in said
    assert_cancelled(conn, job_id, attempts=2, error="cancelled: host lost")
    # Nothing is left for reap.
    assert json.loads(run_cli("reap", "--dsn", dsn, "--json").stdout) == []


def test_cancel_a_selection(conn: psycopg.Connection[Any], dsn: str) -> None:
    mail = add_jobs(conn, 3, queue="emails")
    running = expired(conn, 1, queue="emails", locked_until=None)
    other = add_jobs(conn, 2, queue="sms") + add_jobs(conn, 1, queue="emails", kind="other")
    done = add_jobs(conn, 1, queue="emails", status="done")

    jobs, _ = cancel_json(dsn, "--queue", "emails", "--kind", "test", "--status", "pending")
    assert [j["id"] for j in jobs] == mail
    jobs, _ = cancel_json(dsn, "--queue", "emails", "--queue", "sms", "--kind", "test")
    assert [j["id"] for j in jobs] == running + other[:2]
    statuses = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
    assert statuses[other[2]] == "pending" and statuses[done[0]] == "done"


def test_dry_run_shows_what_would_change_and_writes_nothing(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    pending = add_jobs(conn, 2)
    running = expired(conn)
    before = snapshot(conn)
    jobs, said = cancel_json(dsn, "--status", "pending", "--status", "running", "--dry-run")
    assert [(j["id"], j["status"], j["cancelled_from"]) for j in jobs] == [
        (pending[0], "cancelled", "pending"),
        (pending[1], "cancelled", "pending"),
        (running[0], "cancelled", "running"),
    ]
    assert jobs[0]["last_error"] == "cancelled by an operator"
    assert "would cancel 3 jobs" in said
    assert snapshot(conn) == before


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "nothing selected: give --id, --queue, --kind or --status"),
        (("--status", "done"), "'done' is not one of 'pending', 'running'"),
        (("--id", "0"), "a job id is a positive whole number"),
        (("--id", "1", "--id", "x"), "a job id is a positive whole number"),
    ],
)
def test_bad_input_is_refused_with_exit_2_and_writes_nothing(
    conn: psycopg.Connection[Any], dsn: str, args: tuple[str, ...], says: str
) -> None:
    add_jobs(conn, 2)
    before = snapshot(conn)
    result = run_cli("cancel", "--dsn", dsn, *args)
    assert result.exit_code == 2
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert snapshot(conn) == before


def test_an_id_that_cancel_does_not_take_is_named_and_left_alone(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    (pending,) = add_jobs(conn, 1)
    (done,) = add_jobs(conn, 1, status="done")
    (failed,) = add_jobs(conn, 1, status="failed")
    result = run_cli("cancel", "--dsn", dsn, "--id", str(done), "--id", str(failed))
    assert result.exit_code == 0
    assert f"job {done} is done: cancel takes pending or running jobs; left as it is" in (
        result.stderr
    )
    assert f"job {failed} is failed: cancel takes pending or running jobs" in result.stderr
    assert "no pending or running jobs match" in result.stderr
    # One that is already cancelled says so the same way; a missing one is exit 1.
    run_cli("cancel", "--dsn", dsn, "--id", str(pending))
    result = run_cli("cancel", "--dsn", dsn, "--id", str(pending), "--id", "999999")
    assert result.exit_code == 1
    assert f"job {pending} is cancelled: cancel takes pending or running jobs" in result.stderr
    assert "job 999999 not found" in result.stderr
    assert [job(conn, j)["status"] for j in (pending, done, failed)] == [
        "cancelled",
        "done",
        "failed",
    ]


def test_table_output_lists_the_cancelled_jobs(conn: psycopg.Connection[Any], dsn: str) -> None:
    (job_id,) = add_jobs(conn, 1, kind="resize", queue="images")
    result = run_cli("cancel", "--dsn", dsn, "--id", str(job_id), "--reason", "bad input")
    assert result.exit_code == 0
    header, _, row = result.stdout.splitlines()
    assert header.split() == ["id", "queue", "kind", "status", "attempt", "error"]
    assert row.split() == [
        str(job_id),
        "images",
        "resize",
        "cancelled",
        "0/3",
        "cancelled:",
        "bad",
        "input",
    ]


# -- cancelled among the other statuses ------------------------------------------


def test_stats_list_and_purge_know_cancelled_jobs(conn: psycopg.Connection[Any], dsn: str) -> None:
    ids = add_jobs(conn, 3, queue="imports")
    add_jobs(conn, 1, status="done")
    cancel_json(dsn, "--queue", "imports")

    stats = json.loads(run_cli("stats", "--dsn", dsn, "--json").stdout)
    assert stats["totals"] == {"pending": 0, "running": 0, "done": 1, "failed": 0, "cancelled": 3}
    (imports,) = [q for q in stats["queues"] if q["queue"] == "imports"]
    assert imports["cancelled"] == 3
    table = run_cli("stats", "--dsn", dsn, "--format", "plain").stdout.splitlines()
    assert "cancelled" in table[0].split()

    listed = json.loads(run_cli("list", "--dsn", dsn, "--status", "cancelled", "--json").stdout)
    assert sorted(j["id"] for j in listed) == ids

    result = run_cli("purge", "--dsn", dsn, "--json")
    assert json.loads(result.stdout) == {"deleted": 1}  # done only, by default
    result = run_cli("purge", "--dsn", dsn, "--status", "cancelled", "--json")
    assert json.loads(result.stdout) == {"deleted": 3}
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_purge_all_takes_cancelled_jobs_too(conn: psycopg.Connection[Any], dsn: str) -> None:
    add_jobs(conn, 1, status="done")
    add_jobs(conn, 1, status="failed")
    (job_id,) = add_jobs(conn, 1)
    cancel_json(dsn, "--id", str(job_id))
    # Plain SQL that cancels sets finished_at too (the trigger), so purge sees it.
    (by_sql,) = add_jobs(conn, 1)
    conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (by_sql,))
    assert job(conn, by_sql)["finished_at"] is not None
    result = run_cli("purge", "--dsn", dsn, "--status", "all", "--json")
    assert json.loads(result.stdout) == {"deleted": 4}


def test_the_environment_does_not_select_jobs_to_cancel(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    add_jobs(conn, 1)
    result = run_cli("cancel", "--dsn", dsn, env={**os.environ, "PGQCTL_QUEUE": "default"})
    assert result.exit_code == 2
