"""`pgqctl worker` end to end: real worker processes, real children, a real PostgreSQL.

Jobs are created with plain INSERTs and expired leases reclaimed with the
reap UPDATE of the classic design, so these tests need nothing but the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqctl import embedded
from tests.conftest import gone, needs_embedded, run_cli
from tests.support.jobrows import insert_jobs, job, sh, statuses
from tests.support.processes import PATIENCE, PgqctlProcess, start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

# The reclaim UPDATE of the classic SKIP LOCKED design (what `pgqctl reap` does).
REAP = """
UPDATE jobs
SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'pending' END,
    locked_until = NULL,
    last_error = 'lease expired'
WHERE status = 'running'
  AND locked_until < now()
RETURNING id
"""


def guard_of(worker: PgqctlProcess) -> int:
    """The pid of the worker's guard process."""

    def find() -> int | None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == worker.proc.pid and b"pgqctl.guard" in cmdline:
                    return int(entry.name)
        return None

    wait_until(lambda: find() is not None, 10, "the guard")
    pid = find()
    assert pid is not None
    return pid


# -- running jobs ---------------------------------------------------------------


def test_three_workers_run_every_job_exactly_once(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_worker: Any
) -> None:
    ran = tmp_path / "ran"
    ids = insert_jobs(conn, [sh('echo "$PGQCTL_JOB_ID" >> "$1"', str(ran))] * 300)
    workers = [start_worker(dsn, "--concurrency", "4", "--burst") for _ in range(3)]
    assert [w.finish(timeout=60) for w in workers] == [0, 0, 0]
    assert sorted(int(line) for line in ran.read_text().split()) == ids
    assert statuses(conn) == {"done": 300}
    assert conn.execute("SELECT max(attempts), count(*) FROM jobs").fetchone() == (1, 300)
    assert conn.execute("SELECT count(*) FROM jobs WHERE finished_at IS NULL").fetchone() == (0,)
    # Each worker logged what it ran; together, every job once.
    logged = [line for w in workers for line in w.log.splitlines() if " done in " in line]
    assert len(logged) == 300


def test_failing_job_is_retried_with_backoff_then_fails_for_good(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    [job_id] = insert_jobs(conn, [sh("echo starting; echo 'disk full' >&2; exit 3")])
    worker = start_worker(dsn, "--backoff", "0.2s", "--poll", "30s")
    wait_until(lambda: job(conn, job_id)["status"] == "failed", 15, "the job to fail")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0

    row = job(conn, job_id)
    assert (row["attempts"], row["locked_until"]) == (3, None)
    assert row["finished_at"] is not None
    assert row["last_error"] == "exit status 3\nstarting\ndisk full"
    log = worker.log
    assert log.count("failed: exit status 3; runs again in") == 2
    assert f"job {job_id} failed permanently (attempt 3 of 3): exit status 3" in log
    assert f"job {job_id} | disk full" in log


def test_a_missing_program_fails_at_once_a_missing_directory_is_retried(
    dsn: str, conn: Any, tmp_path: Path
) -> None:
    missing = tmp_path / "not-yet-mounted"
    program, directory = insert_jobs(
        conn,
        [{"argv": ["pgqctl-no-such-program"]}, {"argv": ["true"], "cwd": str(missing)}],
        max_attempts=3,
    )
    result = run_cli("worker", "--dsn", dsn, "--burst", "--backoff", "0")
    assert result.exit_code == 0, result.stderr
    row = job(conn, program)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert row["last_error"] == "command not found: pgqctl-no-such-program"
    # "started" means a process exists: a job that never got one says why instead.
    assert f"job {program} started" not in result.stderr
    assert (
        f"job {program} failed permanently (it can never run): "
        "command not found: pgqctl-no-such-program"
    ) in result.stderr
    # A directory may be there at the next try: burst stops once nothing is
    # due, and the retries were due at once.
    row = job(conn, directory)
    assert (row["status"], row["attempts"]) == ("failed", 3)
    assert row["last_error"] == f"working directory not found: {missing}"
    assert f"job {directory} failed: working directory not found: {missing}; runs again" in (
        result.stderr
    )


def test_arguments_over_the_system_limit_fail_at_once_saying_why(dsn: str, conn: Any) -> None:
    # Linux refuses any one argument over 128 KiB with E2BIG, whatever the total.
    [job_id] = insert_jobs(conn, [{"argv": ["echo", "x" * 200_000]}], max_attempts=3)
    result = run_cli("worker", "--dsn", dsn, "--burst", "--backoff", "0")
    assert result.exit_code == 0, result.stderr
    row = job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert row["last_error"].startswith(
        "cannot start echo: its arguments and environment are too long for the system ("
    )
    assert row["last_error"].endswith(
        "and 131,072 for any one of them): pass large data on stdin or in a file"
    )
    assert f"job {job_id} failed permanently (it can never run): cannot start echo" in (
        result.stderr
    )
    assert "runs again" not in result.stderr


def test_exit_statuses_are_read_even_when_the_worker_inherits_sigchld_ignored(
    dsn: str, conn: Any, tmp_path: Path
) -> None:
    # A parent that ignores SIGCHLD passes that on: the kernel would then reap
    # the worker's children itself, and no exit status could be read.
    jobs = insert_jobs(
        conn,
        [{"argv": ["true"]}, sh("exit 4"), {**sh("exit 5"), "cwd": str(tmp_path)}],
        max_attempts=1,
    )
    script = (
        "import runpy, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); "
        "sys.argv[0] = 'pgqctl'; runpy.run_module('pgqctl', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "worker", "--dsn", dsn, "--burst"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert [(job(conn, j)["status"], job(conn, j)["last_error"]) for j in jobs] == [
        ("done", None),
        ("failed", "exit status 4"),
        ("failed", "exit status 5"),
    ]


def test_shell_payload_is_refused_without_allow_shell_and_runs_with_it(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    [refused] = insert_jobs(conn, [{"shell": "echo hello | tr a-z A-Z"}])
    result = run_cli("worker", "--dsn", dsn, "--burst")
    assert result.exit_code == 0, result.stderr
    row = job(conn, refused)
    # Permanent: failed at once, without burning its other attempts.
    assert (row["status"], row["attempts"]) == ("failed", 1)
    assert "--allow-shell" in row["last_error"]
    assert f"job {refused} failed permanently (it can never run): shell payloads need" in (
        result.stderr
    )

    [allowed] = insert_jobs(conn, [{"shell": "echo hello | tr a-z A-Z"}])
    result = run_cli("worker", "--dsn", dsn, "--burst", "--allow-shell")
    assert result.exit_code == 0, result.stderr
    assert job(conn, allowed)["status"] == "done"
    assert f"job {allowed} | HELLO" in result.stderr
    assert result.stdout == ""


def test_child_gets_job_variables_and_no_database_credentials(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_worker: Any
) -> None:
    dump = tmp_path / "env"
    [job_id] = insert_jobs(conn, [sh('env > "$1"', str(dump))], kind="dump")
    env = {
        **os.environ,
        "PGQCTL_DSN": dsn,
        "DATABASE_URL": dsn,
        "PGPASSWORD": "s3cret-password",
        "APP_SETTING": "kept",
    }
    worker = start_worker(None, "--burst", env=env)
    assert worker.finish() == 0
    child = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert child["PGQCTL_JOB_ID"] == str(job_id)
    assert child["PGQCTL_JOB_KIND"] == "dump"
    assert child["PGQCTL_JOB_QUEUE"] == "default"
    assert child["PGQCTL_JOB_ATTEMPT"] == "1"
    assert child["APP_SETTING"] == "kept"
    assert not {"PGQCTL_DSN", "DATABASE_URL", "PGPASSWORD"} & set(child)
    assert "s3cret-password" not in dump.read_text()
    assert "s3cret-password" not in worker.log


def test_timeout_kills_the_child_and_its_grandchild(
    conn: psycopg.Connection[Any], dsn: str, pidfile: Path
) -> None:
    [job_id] = insert_jobs(
        conn, [sh('sleep 30 & echo $! > "$1"; wait', str(pidfile))], max_attempts=1
    )
    started = time.monotonic()
    result = run_cli("worker", "--dsn", dsn, "--burst", "--timeout", "1s")
    assert result.exit_code == 0, result.stderr
    assert time.monotonic() - started < 25  # not the 30 s of the sleep
    row = job(conn, job_id)
    assert row["status"] == "failed"
    assert row["last_error"] == "timed out after 1s"
    assert gone(int(pidfile.read_text()), within=PATIENCE)


def test_a_timeout_fires_on_time_while_the_worker_waits_on_a_locked_table(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any, pidfile: Path
) -> None:
    script = sh('sleep 30 & echo $! > "$1"; wait', str(pidfile))
    [job_id] = insert_jobs(conn, [{**script, "timeout": 1}], max_attempts=1)
    # A lock timeout far longer than the test: the worker waits as long as
    # the table stays locked.
    worker = start_worker(dsn, "--poll", "0.2s", "--lock-timeout", "5m")
    worker.wait_for_log(f"job {job_id} started")
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), 5, "the grandchild")
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        # The worker's next statement waits on the lock; the job's timeout
        # must not wait with it.
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'pgqctl worker %' AND wait_event_type = 'Lock'"
        )
        wait_until(lambda: conn.execute(waiting).fetchone() == (1,), 3, "the worker to wait")
        assert gone(int(pidfile.read_text()), within=PATIENCE)
        assert conn.execute(waiting).fetchone() == (1,)  # killed while the worker waits
    wait_until(lambda: job(conn, job_id)["status"] == "failed", 15, "the report")
    assert job(conn, job_id)["last_error"] == "timed out after 1s"
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_handler_gets_the_payload_on_stdin_and_json_logs(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    got = tmp_path / "stdin"
    [job_id] = insert_jobs(conn, [{"order_id": 7, "note": "café"}], kind="receipt")
    result = run_cli(
        "worker",
        "--dsn",
        dsn,
        "--burst",
        "--log-format",
        "json",
        "--handler",
        f"receipt=sh -c 'cat > \"$0\"; echo sent' {got}",
    )
    assert result.exit_code == 0, result.stderr
    # Compact JSON, as jsonb keeps it (keys sorted by length, then bytes).
    assert got.read_text() == '{"note":"café","order_id":7}'
    assert job(conn, job_id)["status"] == "done"
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert all(isinstance(e["ts"], str) and isinstance(e["message"], str) for e in events)
    by_event = {e["event"]: e for e in events}
    assert list(by_event) == ["worker_started", "started", "output", "done", "worker_stopped"]
    assert by_event["started"]["job_id"] == job_id
    assert by_event["started"]["attempt"] == 1
    assert by_event["output"]["line"] == "sent"
    assert by_event["done"]["job_id"] == job_id
    assert by_event["done"]["duration"] >= 0


def test_handlers_and_kinds_from_the_environment(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    insert_jobs(conn, [{"n": 1}], kind="first")
    insert_jobs(conn, [{"n": 2}], kind="second")
    handlers = f"first=sh -c 'echo one >> {out}'\nsecond=sh -c 'echo two >> {out}'"
    insert_jobs(conn, [{"n": 3}], kind="third")
    env = {"PGQCTL_HANDLER": handlers, "PGQCTL_KIND": "first second"}
    result = run_cli("worker", "--dsn", dsn, "--burst", env=env)
    assert result.exit_code == 0, result.stderr
    assert sorted(out.read_text().split()) == ["one", "two"]
    assert statuses(conn) == {"done": 2, "pending": 1}


# -- waking -----------------------------------------------------------------------


def test_notification_wakes_an_idle_worker_long_before_its_poll(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    worker = start_worker(dsn, "--poll", "60s")
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN pgqctl_jobs'"
        ).fetchone(),
        10,
        "the worker to listen",
    )
    time.sleep(0.2)  # idle, past its first claim
    [job_id] = insert_jobs(conn, [{"argv": ["true"]}])
    enqueued = time.monotonic()
    wait_until(lambda: job(conn, job_id)["status"] == "done", 5, "the job to run")
    assert time.monotonic() - enqueued < 30  # woken, not the 60 s poll
    worker.signal(signal.SIGINT)
    assert worker.finish() == 0


def test_delayed_job_runs_when_due_without_a_poll(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    conn.execute(
        "INSERT INTO jobs (kind, payload, run_at) "
        """VALUES ('later', '{"argv": ["true"]}', now() + interval '1.5 seconds')"""
    )
    worker = start_worker(dsn, "--poll", "60s")
    wait_until(lambda: statuses(conn) == {"done": 1}, 6, "the delayed job to run")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


# -- stopping -----------------------------------------------------------------------


def test_locked_by_names_the_host_pid_and_slot_the_log_gives(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    ids = insert_jobs(conn, [sh("sleep 30")] * 3)
    worker = start_worker(dsn, "--concurrency", "3", "--grace", "0s")
    for job_id in ids:
        worker.wait_for_log(f"job {job_id} started")
    started = re.findall(r"job (\d+) started: .*slot (\d+), pid (\d+)\)", worker.log)
    slots = {int(job_id): slot for job_id, slot, _ in started}
    # The pid the log gives is the job's process, a child of the worker.
    for _, _, pid in started:
        stat = Path(f"/proc/{pid}/stat").read_text()
        assert int(stat.rsplit(")", 1)[1].split()[1]) == worker.proc.pid
    holder = f"{socket.gethostname()}:{worker.proc.pid}"
    held = dict(conn.execute("SELECT id, locked_by FROM jobs").fetchall())
    assert held == {job_id: f"{holder}:{slots[job_id]}" for job_id in ids}
    assert sorted(slots.values()) == ["0", "1", "2"]
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


# A hang-up (the terminal closed) stops the worker as SIGTERM does.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_lets_a_running_job_finish(
    conn: psycopg.Connection[Any],
    dsn: str,
    start_worker: Any,
    signum: signal.Signals,
    tmp_path: Path,
) -> None:
    # The job runs until the test lets it end, after the signal: however
    # slow the machine, it is still running when the worker hears it.
    release = tmp_path / "release"
    [job_id] = insert_jobs(conn, [sh('while [ ! -e "$1" ]; do sleep 0.05; done', str(release))])
    worker = start_worker(dsn, "--grace", "2m")
    worker.wait_for_log(f"job {job_id} started")
    worker.signal(signum)
    expected = f"{signum.name}: claiming no more jobs; waiting up to 2m00s for 1 running job(s)"
    worker.wait_for_log(expected)
    release.touch()
    assert worker.finish() == 0
    row = job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 1)


def test_sigterm_with_a_short_grace_hands_the_job_back(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    [job_id, waiting] = insert_jobs(conn, [sh("sleep 30")] * 2)
    worker = start_worker(dsn, "--grace", "0.5s", "--concurrency", "1")
    worker.wait_for_log(f"job {job_id} started")
    worker.signal(signal.SIGTERM)
    assert worker.finish(timeout=10) == 0
    row = job(conn, job_id)
    # Back in the queue, due now, with the interrupted attempt given back.
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("pending", 1, 3)
    assert (row["handbacks"], row["locked_until"]) == (1, None)
    assert f"job {job_id} handed back" in worker.log
    assert job(conn, waiting)["attempts"] == 0


def test_a_job_handed_back_twice_keeps_its_budget_and_numbering(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any, tmp_path: Path
) -> None:
    tries, fail = tmp_path / "tries", tmp_path / "fail"
    # Each run records the attempt it was told, then waits to be stopped,
    # or once `fail` exists, fails at once.
    script = 'echo "$PGQCTL_JOB_ATTEMPT" >> "$1"; [ -e "$2" ] && exit 1; sleep 30'
    [job_id] = insert_jobs(conn, [sh(script, str(tries), str(fail))], max_attempts=3)
    for _ in range(2):
        worker = start_worker(dsn, "--grace", "0.2s", "--concurrency", "1")
        worker.wait_for_log(f"job {job_id} started: test, attempt 1 of 3")
        worker.signal(signal.SIGTERM)
        assert worker.finish(timeout=10) == 0
        assert f"job {job_id} handed back: attempt 1 stopped by the shutdown" in worker.log

    shown = run_cli("show", str(job_id), "--dsn", dsn, "--json")
    record = json.loads(shown.stdout)
    assert (record["status"], record["max_attempts"], record["handbacks"]) == ("pending", 3, 2)
    listed = run_cli("list", "--dsn", dsn, "--format", "plain")
    assert " 0/3 " in listed.stdout

    fail.touch()
    worker = start_worker(dsn, "--backoff", "0.05s", "--poll", "0.2s")
    wait_until(lambda: job(conn, job_id)["status"] == "failed", 15, "the job to fail")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    log = worker.log
    for n in (1, 2, 3):
        assert f"job {job_id} started: test, attempt {n} of 3" in log
    assert f"job {job_id} failed permanently (attempt 3 of 3)" in log
    # Two hand-backs, then exactly three real tries, each told its number.
    assert tries.read_text().split() == ["1", "1", "1", "2", "3"]
    row = job(conn, job_id)
    assert (row["attempts"], row["handbacks"], row["max_attempts"]) == (5, 2, 3)

    # Requeue grants tries from those used: one more means one more run.
    requeued = run_cli("requeue", "--id", str(job_id), "--dsn", dsn, "--json")
    assert json.loads(requeued.stdout)[0]["max_attempts"] == 4


def test_second_signal_stops_running_jobs_at_once(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    [job_id] = insert_jobs(conn, [sh("sleep 30")])
    worker = start_worker(dsn, "--grace", "5m")
    worker.wait_for_log(f"job {job_id} started")
    worker.signal(signal.SIGINT)
    worker.wait_for_log("signal again to stop them now")
    worker.signal(signal.SIGINT)
    assert worker.finish(timeout=10) == 0
    assert job(conn, job_id)["status"] == "pending"
    assert "SIGINT: stopping 1 running job(s) now" in worker.log


# -- crashes and lost leases ----------------------------------------------------------


def test_killed_worker_job_comes_back_through_reap_with_its_attempt_count(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any, pidfile: Path
) -> None:
    # Attempt 1 runs a grandchild that ignores SIGTERM, as a stubborn job would.
    script = (
        'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then '
        'sh -c \'trap "" TERM; echo $$ > "$1"; sleep 30\' - "$1"; fi'
    )
    [job_id] = insert_jobs(conn, [sh(script, str(pidfile))])
    first = start_worker(dsn, "--lease", "2s")
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), 10, "the job to start")
    # The worker tells its guard of a job's group just after starting it,
    # then logs the start: killed before that (a few microseconds; longer
    # on a loaded machine) the job would be left unguarded.
    first.wait_for_log(f"job {job_id} started")
    first.proc.kill()
    first.proc.wait()
    assert conn.execute(REAP).fetchall() == []  # the lease still holds
    # The worker could not stop its job: its guard does (TERM, then KILL 5 s
    # later), so the next attempt never runs beside this one.
    assert gone(int(pidfile.read_text()), within=PATIENCE)
    wait_until(lambda: "stopping them" in first.log, 5, "the guard's log line")
    assert "is gone without stopping 1 job process group(s); stopping them" in first.log
    wait_until(lambda: conn.execute(REAP).fetchall(), 5, "the lease to expire")

    second = start_worker(dsn, "--burst")
    assert second.finish() == 0
    row = job(conn, job_id)
    assert (row["status"], row["attempts"]) == ("done", 2)


def test_frozen_worker_cannot_overwrite_the_job_after_losing_its_lease(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_worker: Any
) -> None:
    ran = tmp_path / "ran"
    script = 'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then sleep 2; fi; echo $PGQCTL_JOB_ATTEMPT >> "$1"'
    [job_id] = insert_jobs(conn, [sh(script, str(ran))])
    frozen = start_worker(dsn, "--lease", "1s")
    frozen.wait_for_log(f"job {job_id} started")
    frozen.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: conn.execute(REAP).fetchall(), 5, "the lease to expire")
        second = start_worker(dsn, "--burst")
        assert second.finish() == 0
        done = job(conn, job_id)
        assert (done["status"], done["attempts"]) == ("done", 2)
        # The frozen worker's child carried on and finished attempt 1 meanwhile.
        wait_until(lambda: ran.exists() and "1" in ran.read_text().split(), 5, "attempt 1")
    finally:
        frozen.signal(signal.SIGCONT)
    frozen.wait_for_log("lease lost")
    frozen.signal(signal.SIGTERM)
    assert frozen.finish() == 0
    assert job(conn, job_id) == done
    assert f"job {job_id} lease lost: attempt 1 " in frozen.log
    assert " done in " not in frozen.log


def test_terminated_connections_are_retried_and_no_job_is_lost(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_worker: Any
) -> None:
    ran = tmp_path / "ran"
    ids = insert_jobs(conn, [sh('sleep 0.2; echo "$PGQCTL_JOB_ID" >> "$1"', str(ran))] * 16)
    worker = start_worker(dsn, "--concurrency", "2", "--poll", "1s")
    wait_until(lambda: statuses(conn).get("done", 0) >= 2, 10, "some jobs to finish")
    terminated = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE 'pgqctl worker %'"
    ).fetchone()
    assert terminated == (2,)  # the main connection and the listener
    wait_until(lambda: statuses(conn) == {"done": 16}, 20, "every job to finish")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert sorted(int(line) for line in ran.read_text().split()) == ids
    assert "database connection lost: " in worker.log
    assert "database connection restored" in worker.log


@pytest.mark.slow
@needs_embedded
def test_database_restart_mid_run_loses_no_job(tmp_path: Path, start_worker: Any) -> None:
    data = Path(tempfile.mkdtemp(prefix="pgqctl-restart-", dir="/tmp")) / "data"
    server = embedded.start_throwaway(data)
    try:
        assert run_cli("migrate", "--dsn", server.dsn).exit_code == 0
        ran = tmp_path / "ran"
        with psycopg.connect(server.dsn, autocommit=True) as db:
            ids = insert_jobs(db, [sh('sleep 0.3; echo "$PGQCTL_JOB_ID" >> "$1"', str(ran))] * 24)
        worker = start_worker(server.dsn, "--concurrency", "4", "--lease", "3s", "--poll", "0.5s")
        wait_until(lambda: ran.exists() and len(ran.read_text().split()) >= 4, 15, "some jobs")
        embedded.stop(data)
        time.sleep(1)
        embedded.ensure_running(data)

        def all_done() -> bool:
            with psycopg.connect(server.dsn, autocommit=True) as db:
                # A claim whose answer the restart swallowed comes back by reap.
                db.execute(REAP)
                return statuses(db) == {"done": 24}

        wait_until(all_done, 40, "every job to be done")
        worker.signal(signal.SIGTERM)
        assert worker.finish() == 0
        assert set(int(line) for line in ran.read_text().split()) == set(ids)
        assert "database connection lost: " in worker.log
        assert "database connection restored" in worker.log
    finally:
        embedded.stop(data)
        shutil.rmtree(data.parent, ignore_errors=True)


@needs_embedded
def test_a_worker_stopping_while_the_database_is_down_names_what_it_could_not_report(
    tmp_path: Path, start_worker: Any
) -> None:
    data = Path(tempfile.mkdtemp(prefix="pgqctl-down-", dir="/tmp")) / "data"
    server = embedded.start_throwaway(data)
    try:
        assert run_cli("migrate", "--dsn", server.dsn).exit_code == 0
        with psycopg.connect(server.dsn, autocommit=True) as db:
            [job_id] = insert_jobs(db, [sh("sleep 1")])
        worker = start_worker(server.dsn, "--lease", "2s", "--grace", "30s")
        worker.wait_for_log(f"job {job_id} started")
        embedded.stop(data)
        worker.signal(signal.SIGTERM)
        # The job ends within the grace; its result has nowhere to go.
        assert worker.finish(timeout=30) == 1
        assert (
            f"could not report 1 job(s) ({job_id}): the database is unreachable; "
            "they return to the queue when their leases expire"
        ) in worker.log
        embedded.ensure_running(data)
        with psycopg.connect(server.dsn, autocommit=True) as db:
            wait_until(lambda: db.execute(REAP).fetchall() == [(job_id,)], 10, "the reap")
            assert job(db, job_id)["attempts"] == 1
    finally:
        embedded.stop(data)
        shutil.rmtree(data.parent, ignore_errors=True)


def test_concurrency_beyond_the_open_file_limit_raises_it_or_is_refused(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    from pgqctl.runner import open_files_needed

    slots = 60
    # Each job holds all of its descriptors (output, stdin, pidfd) while its
    # stdin is being written: a payload larger than the pipe, read late.
    stdin = "x" * 200_000
    ids = insert_jobs(conn, [{**sh("sleep 1; cat > /dev/null"), "stdin": stdin}] * slots)
    need = open_files_needed(slots)

    def worker(soft: int, hard: int) -> subprocess.CompletedProcess[str]:
        def set_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst"]
        return subprocess.run(
            [*command, "--concurrency", str(slots)],
            preexec_fn=set_limit,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = worker(need - 1, need - 1)
    assert refused.returncode == 2
    assert f"--concurrency {slots} needs up to {need} open files and the hard limit is" in (
        refused.stderr
    )
    assert statuses(conn) == {"pending": slots}

    # A soft limit far too low is raised up to the hard one: every job runs.
    ran = worker(64, need)
    assert ran.returncode == 0, ran.stderr
    assert [job(conn, i)["attempts"] for i in ids] == [1] * slots
    assert statuses(conn) == {"done": slots}
    assert len(re.findall(r"job \d+ started: ", ran.stderr)) == slots


def test_a_stopped_guard_neither_holds_up_nor_outlives_its_worker(
    dsn: str, start_worker: Any
) -> None:
    worker = start_worker(dsn)
    guard = guard_of(worker)
    os.kill(guard, signal.SIGSTOP)
    try:
        worker.wait_for_log("worker ")
        worker.signal(signal.SIGTERM)
        time.sleep(0.5)  # stopping, waiting for the guard to exit
        worker.signal(signal.SIGTERM)  # a second signal then changes nothing
        assert worker.finish(timeout=20) == 0
        assert " stopped after 0 job(s)" in worker.log
        assert gone(guard, within=PATIENCE)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(guard, signal.SIGKILL)


def test_a_worker_says_when_it_has_lost_its_guard(
    conn: psycopg.Connection[Any], dsn: str, start_worker: Any
) -> None:
    worker = start_worker(dsn, "--poll", "0.2s")
    guard = guard_of(worker)
    os.kill(guard, signal.SIGKILL)
    insert_jobs(conn, [{"argv": ["true"]}] * 3)
    wait_until(lambda: statuses(conn) == {"done": 3}, 10, "the jobs")
    worker.wait_for_log(f"guard process {guard} is gone")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_a_worker_with_stderr_closed_still_runs_jobs(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    [job_id] = insert_jobs(conn, [{"argv": ["true"]}])
    result = subprocess.run(
        [sys.executable, "-m", "pgqctl", "worker", "--burst", "--dsn", dsn],
        preexec_fn=lambda: os.close(2),
        stdout=subprocess.DEVNULL,
        timeout=30,
    )
    assert result.returncode == 0
    assert job(conn, job_id)["status"] == "done"
