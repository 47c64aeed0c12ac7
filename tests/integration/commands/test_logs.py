"""`pgqctl logs ID`: an attempt's kept output, as a real worker kept it."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, sh
from tests.support.processes import start_worker

__all__ = ["start_worker"]  # a fixture


def test_logs_names_the_attempt_and_json_has_every_field(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [sh("exit $PGQCTL_JOB_ATTEMPT")], max_attempts=2)
    assert start_worker(dsn, "--burst", "--backoff", "0").finish() == 0

    latest = run_cli("logs", str(job_id), "--json", "--dsn", dsn)
    assert latest.exit_code == 0, latest.stderr
    found = json.loads(latest.stdout)
    assert (found["attempt"], found["outcome"], found["exit_status"]) == (2, "failed", 2)
    assert {"stdout_head", "stderr_tail", "max_rss_bytes", "user_cpu", "late"} <= set(found)
    assert latest.stderr.startswith(f"pgqctl: job {job_id} attempt 2 (claim 2) on ")

    first = run_cli("logs", str(job_id), "--attempt", "1", "--json", "--dsn", dsn)
    assert json.loads(first.stdout)["exit_status"] == 1


def test_logs_of_a_job_without_attempts_exits_1_and_says_where_to_look(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = insert_jobs(conn, [sh("true")])
    result = run_cli("logs", str(job_id), "--dsn", dsn)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        f"pgqctl: error: no attempt recorded for job {job_id} in schema public: "
        f"`pgqctl show {job_id}` lists the job's attempts"
    )
    other = run_cli("logs", str(job_id), "--attempt", "3", "--dsn", dsn)
    assert other.exit_code == 1 and f"attempt 3 of job {job_id}" in other.stderr
