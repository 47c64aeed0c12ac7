"""Every attempt of a job kept, with real workers: how each try ended, where
and when, a timeout's signal, a killed worker's attempt once reaped, a
cancelled one, a stale worker's late record beside the live claim's, and
the history going with its job on purge."""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import insert_jobs, job, sh
from tests.support.processes import start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

BEAT = ("--heartbeat", "0.5s", "--lease", "5m")


def history(dsn: str, job_id: int) -> list[dict[str, Any]]:
    attempts: list[dict[str, Any]] = cli_json(dsn, "show", str(job_id))["history"]
    return attempts


def test_a_job_failing_twice_then_succeeding_shows_three_attempts(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    script = 'echo "try $PGQCTL_JOB_ATTEMPT"; [ "$PGQCTL_JOB_ATTEMPT" -ge 3 ] || exit 4'
    (job_id,) = insert_jobs(conn, [sh(script)])
    worker = start_worker(dsn, "--burst", "--backoff", "0")
    assert worker.finish() == 0
    tries = history(dsn, job_id)
    assert [(t["attempt"], t["claim"], t["outcome"], t["exit_status"]) for t in tries] == [
        (1, 1, "failed", 4),
        (2, 2, "failed", 4),
        (3, 3, "done", 0),
    ]
    host_pid = f":{worker.pid}:"
    for t in tries:
        assert host_pid in t["worker"] and t["recorded_by"] == "worker" and not t["late"]
        assert t["due_at"] <= t["claimed_at"] <= t["started_at"] <= t["finished_at"]
        assert 0 <= t["seconds"] < 10
    assert [t["error"] for t in tries] == ["exit status 4", "exit status 4", None]
    # Each try after the one before it ended.
    assert tries[0]["finished_at"] <= tries[1]["claimed_at"] <= tries[2]["claimed_at"]
    assert job(conn, job_id)["claimed_at"] is not None

    shown = run_cli("show", str(job_id), "--format", "plain", "--dsn", dsn)
    timeline = shown.stdout.split("attempts:\n", 1)[1].splitlines()
    assert timeline[0].split() == [
        "attempt",
        "started",
        "worker",
        "took",
        "outcome",
        "cpu",
        "memory",
        "output",
    ]
    assert [line.split()[0] for line in timeline[2:]] == ["#1", "#2", "#3"]
    assert "failed (exit 4)" in timeline[2] and "done" in timeline[4]


def test_a_job_killed_by_its_timeout_shows_the_signal(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [{"argv": ["sleep", "30"], "timeout": 0.5}], max_attempts=1)
    assert start_worker(dsn, "--burst").finish() == 0
    (only,) = history(dsn, job_id)
    assert only["outcome"] == "timed_out" and only["signal"] == signal.SIGTERM
    assert only["error"].startswith("timed out after 0.5s")
    assert 0.4 < only["seconds"] < 10


def test_a_killed_workers_attempt_shows_as_lease_lost_once_reaped(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [{"argv": ["sleep", "60"]}])
    doomed = start_worker(dsn, "--no-reap", *BEAT)
    wait_until(lambda: job(conn, job_id)["status"] == "running", 30, "the job to start")
    holder = job(conn, job_id)["locked_by"]
    doomed.kill()  # kill -9: it records nothing
    wait_until(
        lambda: run_cli("reap", "--worker", holder.rpartition(":")[0], "--dsn", dsn).exit_code == 0,
        15,
        "the killed worker to go stale and be reaped",
    )
    (lost,) = history(dsn, job_id)
    assert (lost["outcome"], lost["recorded_by"], lost["worker"]) == ("lease_lost", "reap", holder)
    assert lost["claim"] == 1 and lost["started_at"] is None
    assert "reaped on demand" in lost["error"]


def test_a_cancelled_running_job_shows_cancelled_with_what_its_process_did(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [{"argv": ["sleep", "60"]}])
    worker = start_worker(dsn)
    wait_until(lambda: job(conn, job_id)["status"] == "running", 30, "the job to start")
    result = run_cli("cancel", "--id", str(job_id), "--reason", "wrong data", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    # The worker stops the job, then records what its process did.
    wait_until(lambda: history(dsn, job_id)[0]["signal"] is not None, 30, "the worker's record")
    (cancelled,) = history(dsn, job_id)
    assert (cancelled["outcome"], cancelled["recorded_by"]) == ("cancelled", "cancel")
    assert cancelled["signal"] == signal.SIGTERM and cancelled["started_at"] is not None
    assert "wrong data" in cancelled["error"] and not cancelled["late"]
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_a_stale_workers_late_record_never_touches_the_live_claim(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # The first claim sleeps 3 s; the second, on the other worker, ends at once.
    script = 'if [ "$PGQCTL_CLAIM" = 1 ] || [ "$PGQCTL_JOB_CLAIM" = 1 ]; then sleep 3; fi'
    (job_id,) = insert_jobs(conn, [sh(script)])
    stalled = start_worker(dsn, "--no-reap", *BEAT)
    wait_until(lambda: job(conn, job_id)["status"] == "running", 30, "the job to start")
    holder = job(conn, job_id)["locked_by"].rpartition(":")[0]
    stalled.signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: run_cli("reap", "--worker", holder, "--dsn", dsn).exit_code == 0,
            15,
            "the stopped worker to go stale and be reaped",
        )
        rescuer = start_worker(dsn, "--burst")
        assert rescuer.finish() == 0
        assert job(conn, job_id)["status"] == "done"
        time.sleep(3)  # the first claim's process ends meanwhile
    finally:
        stalled.signal(signal.SIGCONT)
    wait_until(lambda: history(dsn, job_id)[0]["late"], 30, "the stale worker's record")
    first, second = history(dsn, job_id)
    assert (first["claim"], first["outcome"], first["recorded_by"]) == (1, "lease_lost", "reap")
    assert first["late"] and first["started_at"] is not None  # what its process did, added
    assert (second["claim"], second["outcome"], second["late"]) == (2, "done", False)
    assert f":{rescuer.pid}:" in second["worker"]
    stalled.signal(signal.SIGTERM)
    assert stalled.finish() == 0


def test_purge_deletes_a_jobs_attempts_with_it(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    kept, purged = insert_jobs(conn, [{"argv": ["true"]}, {"argv": ["true"]}])
    assert start_worker(dsn, "--burst").finish() == 0
    conn.execute("UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = %s", (purged,))
    result = run_cli("purge", "--older-than", "1d", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    rows = conn.execute("SELECT job_id FROM attempts ORDER BY job_id").fetchall()
    assert rows == [(kept,)]


def test_a_worker_without_history_records_no_attempt(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [sh("exit 0")])
    assert start_worker(dsn, "--burst", "--no-history").finish() == 0
    assert job(conn, job_id)["status"] == "done"
    assert history(dsn, job_id) == []
