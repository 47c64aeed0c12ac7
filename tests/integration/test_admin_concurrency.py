"""reap and purge next to real concurrent sessions: other reaps, workers, row locks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, ago, expired

# A worker's batch claim and fenced report, as plain SQL.
CLAIM = """
UPDATE jobs
SET status = 'running', attempts = attempts + 1, locked_until = now() + interval '5 minutes'
WHERE id IN (
  SELECT id FROM jobs
  WHERE status = 'pending' AND run_at <= now()
  ORDER BY priority DESC, run_at, id
  LIMIT 10
  FOR UPDATE SKIP LOCKED
)
RETURNING id, attempts
"""
REPORT_DONE = """
UPDATE jobs SET status = 'done', locked_until = NULL, finished_at = now()
WHERE id = %s AND status = 'running' AND attempts = %s
"""


def wait_for(predicate: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_concurrent_reaps_handle_every_job_exactly_once(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    retry = expired(conn, 1500, attempts=1)
    dead = expired(conn, 1500, attempts=3)
    # Hold the reaps at their UPDATE until all four wait, then let them race.
    gate = psycopg.connect(dsn)
    gate.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "pgqctl", "reap", "--json", "--dsn", dsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]

    def waiting() -> bool:
        row = conn.execute(
            # This database's: a clone of the same template has the same oid
            # for its jobs table, and other tests may run beside this one.
            "SELECT count(*) FROM pg_locks WHERE relation = 'jobs'::regclass AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return row is not None and row[0] == 4

    try:
        wait_for(waiting, "four reaps to wait on the table")
    finally:
        gate.commit()
        gate.close()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs

    handled = [j for out, _ in outputs for j in json.loads(out)]
    assert len(handled) == len(retry) + len(dead)
    assert sorted(j["id"] for j in handled) == sorted(retry + dead)
    rows = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
    assert {rows[i] for i in retry} == {"pending"}
    assert {rows[i] for i in dead} == {"failed"}


def test_reap_skips_a_row_a_worker_has_locked_instead_of_waiting(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    busy, free = expired(conn, 2)
    with psycopg.connect(dsn) as worker:
        worker.execute("SELECT 1 FROM jobs WHERE id = %s FOR UPDATE", (busy,))
        # Fail instead of hanging, should reap ever wait on the lock.
        started = time.monotonic()
        result = run_cli("reap", "--json", "--dsn", dsn, "--lock-timeout", "1m")
        elapsed = time.monotonic() - started
        assert result.exit_code == 0, result.stderr
        assert [j["id"] for j in json.loads(result.stdout)] == [free]
        assert elapsed < 30  # it skipped the locked row: no wait for the lock
        worker.rollback()
    assert [j["id"] for j in json.loads(run_cli("reap", "--json", "--dsn", dsn).stdout)] == [busy]


def test_purge_while_workers_claim_and_complete(dsn: str, conn: psycopg.Connection[Any]) -> None:
    old_done = add_jobs(conn, 3000, status="done", attempts=1, finished_at=ago("2 hours"))
    old_failed = add_jobs(conn, 50, status="failed", attempts=3, finished_at=ago("2 hours"))
    live = add_jobs(conn, 1500)
    stop = threading.Event()
    errors: list[BaseException] = []
    completed: list[int] = []

    def work() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    claimed = c.execute(CLAIM).fetchall()
                    if not claimed:
                        return
                    for job_id, attempt in claimed:
                        if c.execute(REPORT_DONE, (job_id, attempt)).rowcount == 1:
                            completed.append(job_id)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        wait_for(lambda: len(completed) >= 20, "workers to get going")
        result = run_cli(
            "purge", "--older-than", "1h", "--batch-size", "200", "--json", "--dsn", dsn
        )
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    assert errors == []
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"deleted": len(old_done)}
    remaining = {r[0] for r in conn.execute("SELECT id FROM jobs")}
    assert remaining.isdisjoint(old_done)
    assert set(live) <= remaining  # pending, running or just done: never purged
    assert set(old_failed) <= remaining
    assert len(completed) == len(set(completed))
