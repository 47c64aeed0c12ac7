"""`pgqctl logs ID`: an attempt's kept output, as a real worker kept it."""

from __future__ import annotations

import json
import sys
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


def logs(dsn: str, job_id: int, *args: str) -> tuple[str, str]:
    result = run_cli("logs", str(job_id), *args, "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return result.stdout, result.stderr


def test_each_stream_of_each_attempt_is_kept_apart(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    script = 'echo "out $PGQCTL_JOB_ATTEMPT"; echo "err $PGQCTL_JOB_ATTEMPT" >&2; exit 1'
    (job_id,) = insert_jobs(conn, [sh(script)], max_attempts=2)
    assert start_worker(dsn, "--burst", "--backoff", "0").finish() == 0

    assert logs(dsn, job_id, "--stdout")[0] == "out 2\n"
    assert logs(dsn, job_id, "--stderr", "--attempt", "1")[0] == "err 1\n"
    both, _ = logs(dsn, job_id, "--attempt", "1")
    assert both == "--- stdout: 6 B ---\nout 1\n--- stderr: 6 B ---\nerr 1\n"
    found = json.loads(logs(dsn, job_id, "--json")[0])
    assert (found["stdout_head"], found["stdout_tail"], found["stdout_bytes"]) == ("out 2\n", "", 6)
    assert (found["stderr_head"], found["stderr_bytes"]) == ("err 2\n", 6)
    # show's timeline ends each attempt with its last words (stderr first).
    shown = run_cli("show", str(job_id), "--format", "plain", "--dsn", dsn).stdout
    timeline = shown.split("attempts:\n", 1)[1].splitlines()
    assert timeline[2].endswith("err 1") and timeline[3].endswith("err 2")


def test_a_hundred_megabytes_of_output_keep_only_its_head_and_tail(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    script = "head -c 100000000 /dev/zero | tr '\\0' x; echo; echo the end"
    (job_id,) = insert_jobs(conn, [sh(script)])
    worker = start_worker(dsn, "--burst", "--keep-output", "1000", "--log-output-bytes", "100")
    assert worker.finish() == 0

    found = json.loads(logs(dsn, job_id, "--json")[0])
    assert found["stdout_bytes"] == 100_000_000 + len("\nthe end\n")
    assert found["stdout_head"] == "x" * 500
    assert found["stdout_tail"] == "x" * (500 - 9) + "\nthe end\n"
    text, _ = logs(dsn, job_id, "--stdout")
    assert text == "x" * 500 + "\n[... 99,999,009 bytes left out ...]\n" + found["stdout_tail"]
    size = conn.execute("SELECT pg_column_size(a.*) FROM attempts AS a").fetchone()
    assert size is not None and size[0] < 4000  # the row holds what was kept, no more


def test_an_attempt_records_the_cpu_and_the_peak_memory_of_its_process(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    busy = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    hungry = "data = bytearray(300 * 1024 * 1024)\nfor i in range(0, len(data), 4096): data[i] = 1"
    spin, grow = insert_jobs(
        conn, [{"argv": [sys.executable, "-c", busy]}, {"argv": [sys.executable, "-c", hungry]}]
    )
    assert start_worker(dsn, "--burst").finish() == 0
    spun = json.loads(logs(dsn, spin, "--json")[0])
    # It spins until it has used 0.3 s of CPU (reading its clock is a system call).
    assert spun["user_cpu"] + spun["system_cpu"] >= 0.3 and spun["user_cpu"] > 0
    grown = json.loads(logs(dsn, grow, "--json")[0])
    assert grown["max_rss_bytes"] >= 300 * 1024 * 1024
    shown = run_cli("show", str(grow), "--format", "plain", "--dsn", dsn).stdout
    assert " MB" in shown.split("attempts:\n", 1)[1]  # its memory in the timeline
