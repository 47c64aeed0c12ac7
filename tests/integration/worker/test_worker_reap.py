"""Workers reclaim expired leases themselves: real worker processes, a real
`kill -9`, no cron.
"""

from __future__ import annotations

import json
import re
import signal
import time
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import expired, insert_jobs, job, sh
from tests.support.processes import start_worker, wait_until

__all__ = ["start_worker"]  # a fixture


def reaped_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " reaped " in line]


def test_a_killed_workers_jobs_are_reaped_by_another_worker_and_then_complete(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # The first attempt hangs; the next one, after the reap, finishes.
    script = 'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then exec sleep 60; fi'
    ids = insert_jobs(conn, [sh(script)] * 2)
    doomed = start_worker(dsn, "--concurrency", "2", "--lease", "2s", "--no-reap")
    started = re.compile(r" job \d+ started")
    wait_until(lambda: len(started.findall(doomed.log)) == 2, 15, "the jobs to start")
    rescuer = start_worker(
        dsn, "--concurrency", "2", "--lease", "2s", "--reap-every", "0.5s", "--poll", "30s"
    )
    rescuer.wait_for_log("worker ")
    # Live leases are renewed: nothing is reaped while their worker lives.
    time.sleep(3)
    assert reaped_lines(rescuer.log) == []
    assert {job(conn, i)["status"] for i in ids} == {"running"}

    doomed.proc.kill()  # SIGKILL: no hand-back, the leases just run out
    doomed.proc.wait()
    wait_until(lambda: {job(conn, i)["status"] for i in ids} == {"done"}, 20, "the jobs to finish")
    assert [job(conn, i)["attempts"] for i in ids] == [2, 2]
    [line] = reaped_lines(rescuer.log)
    assert f"reaped 2 expired lease(s) (job {ids[0]}, {ids[1]})" in line
    assert "2 back to pending, 0 failed" in line
    rescuer.signal(signal.SIGTERM)
    assert rescuer.finish() == 0


def test_concurrent_reaping_workers_reap_each_job_once(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # Out of attempts: each reaped job ends failed, so nothing runs them again.
    ids = expired(conn, 2000, attempts=1, max_attempts=1)
    workers = []
    # The table locked until every worker is up and waiting on it: then they
    # claim, find nothing due, and reap, all at the same moment.
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        for _ in range(4):
            workers.append(start_worker(dsn, "--burst", "--log-format", "json"))
        waiting = (
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        wait_until(
            lambda: conn.execute(waiting).fetchone() == (4,), 20, "every worker to wait on jobs"
        )
    assert [w.proc.wait(30) for w in workers] == [0, 0, 0, 0]
    reaped: list[int] = []
    for w in workers:
        for line in w.log.splitlines():
            event = json.loads(line)
            if event["event"] == "reaped":
                reaped += event["jobs"]
                assert event["failed"] == event["jobs"]
    assert sorted(reaped) == ids  # each exactly once, among all of them
    rows = conn.execute(
        "SELECT status, attempts, count(*) FROM jobs GROUP BY 1, 2 ORDER BY 1"
    ).fetchall()
    assert rows == [("failed", 1, 2000)]


def test_a_burst_worker_reaps_before_it_decides_nothing_is_due_unless_told_not_to(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    [job_id] = expired(conn, 1, payload=json.dumps({"argv": ["true"]}))
    left = run_cli("worker", "--burst", "--no-reap", "--dsn", dsn)
    assert left.exit_code == 0, left.stderr
    assert " reaped " not in left.stderr and "no reap" in left.stderr
    assert job(conn, job_id)["status"] == "running"  # for cron's `pgqctl reap`

    reaping = run_cli("worker", "--burst", "--dsn", dsn)
    assert reaping.exit_code == 0, reaping.stderr
    assert f"reaped 1 expired lease(s) (job {job_id}) held by host:1:0" in reaping.stderr
    row = job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 2)  # reaped, then run


def test_reaping_never_takes_the_workers_own_jobs(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    [job_id] = insert_jobs(conn, [{"argv": ["sleep", "4"]}])
    worker = start_worker(dsn, "--lease", "2s", "--reap-every", "0.2s", "--burst")
    assert worker.finish() == 0
    row = job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)
    assert reaped_lines(worker.log) == []


def test_a_worker_survives_losing_its_connection_while_it_reaps(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    worker = start_worker(dsn, "--reap-every", "0.1s", "--poll", "0.1s")
    worker.wait_for_log("worker ")
    kill = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name LIKE 'pgqctl worker %' AND datname = current_database()"
    )
    for _ in range(10):
        conn.execute(kill)
        time.sleep(0.15)
    [job_id] = expired(conn, 1, payload=json.dumps({"argv": ["true"]}))
    wait_until(lambda: job(conn, job_id)["status"] == "done", 30, "the reaped job to run")
    assert worker.proc.poll() is None
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0  # every line a log line: no traceback
    assert "database connection lost" in worker.log
