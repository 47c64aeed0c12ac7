"""`pgqctl why ID`: each reason a job is not running, read from the database
as an operator would meet it, with real workers where a worker is the reason,
and the command it names doing what it says."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, ago
from tests.support.processes import PgqctlProcess, start_pgqctl, wait_until
from tests.support.servers import insert_jobs

__all__ = ["start_pgqctl"]  # a fixture


def why(dsn: str, job_id: int) -> dict[str, Any]:
    result = run_cli("why", str(job_id), "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def codes(dsn: str, job_id: int) -> list[str]:
    return [r["code"] for r in why(dsn, job_id)["reasons"]]


def reason(dsn: str, job_id: int, code: str) -> dict[str, Any]:
    (found,) = [r for r in why(dsn, job_id)["reasons"] if r["code"] == code]
    return found


def run_command(dsn: str, command: str) -> None:
    """Run the command a reason names, as the operator would paste it."""
    words = shlex.split(command)
    assert words[0] == "pgqctl"
    result = run_cli(*words[1:], "--dsn", dsn)
    assert result.exit_code == 0, result.stderr


def register(conn: psycopg.Connection[Any], worker_id: str, **columns: Any) -> None:
    """A worker's row as a live worker leaves it (heartbeat just now)."""
    host, _, pid = worker_id.rpartition(":")
    values = {"concurrency": 2, "running": 0, "queues": [], "kinds": [], **columns}
    conn.execute(
        "INSERT INTO workers (id, host, pid, version, concurrency, running, queues, kinds, "
        "heartbeat_seconds, lease_seconds) VALUES (%s, %s, %s, 'test', %s, %s, %s, %s, 10, 300)",
        (
            worker_id,
            host,
            int(pid),
            values["concurrency"],
            values["running"],
            values["queues"],
            values["kinds"],
        ),
    )


def test_a_job_nothing_holds_is_said_to_be_claimable(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    register(conn, "h:1", concurrency=4, running=1)
    (job,) = add_jobs(conn, run_at=ago("10 seconds"))
    found = why(dsn, job)
    assert found["status"] == "pending" and found["id"] == job
    (only,) = found["reasons"]
    assert only["code"] == "claimable"
    assert (only["workers"], only["slots"], only["running"]) == (1, 4, 1)
    assert "3 of 4 slots free" in only["message"] and only["command"] is None


def test_a_delayed_job_and_one_waiting_to_retry_say_when_and_requeue_makes_them_due(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    register(conn, "h:1")
    (later,) = add_jobs(conn, run_at=ago("-1 hour"))
    (retry,) = add_jobs(
        conn,
        run_at=ago("-10 minutes"),
        attempts=1,
        last_error="exit status 1\nconvert: no such file a.png",
    )
    delayed = reason(dsn, later, "not_due")
    assert 3500 < delayed["due_in"] <= 3600 and delayed["retry"] is False
    waiting = reason(dsn, retry, "not_due")
    assert waiting["retry"] is True and (waiting["tries"], waiting["max_attempts"]) == (1, 3)
    assert (
        "waits to retry after try 1 of 3: exit status 1: convert: no such file a.png"
        in (waiting["message"])
    )
    run_command(dsn, waiting["command"])
    assert codes(dsn, retry) == ["claimable"]


def test_a_paused_queue_is_named_with_its_reason_and_resume_ends_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    register(conn, "h:1")
    (job,) = add_jobs(conn, queue="emails")
    assert run_cli("pause", "emails", "--reason", "provider down", "--dsn", dsn).exit_code == 0
    paused = reason(dsn, job, "paused")
    assert paused["reason"] == "provider down" and paused["until"] is None
    assert paused["command"] == "pgqctl resume emails"
    run_command(dsn, paused["command"])
    assert codes(dsn, job) == ["claimable"]


def test_no_active_worker_for_its_queue_or_kind(dsn: str, conn: psycopg.Connection[Any]) -> None:
    (job,) = add_jobs(conn, queue="reports", kind="pdf")
    missing = reason(dsn, job, "no_worker")
    assert missing["active_workers"] == 0
    assert missing["command"] == "pgqctl worker --queue reports"
    register(conn, "h:1", queues=["emails"])  # another queue
    register(conn, "h:2", queues=["reports"], kinds=["csv"])  # its queue, another kind
    assert reason(dsn, job, "no_worker")["active_workers"] == 2
    register(conn, "h:3", kinds=["pdf"])
    assert codes(dsn, job) == ["claimable"]
    # A worker that stopped heartbeating takes nothing.
    conn.execute("UPDATE workers SET last_seen = now() - interval '1 minute' WHERE id = 'h:3'")
    assert codes(dsn, job) == ["no_worker"]


def test_due_jobs_ahead_in_claim_order_are_counted(dsn: str, conn: psycopg.Connection[Any]) -> None:
    register(conn, "h:1", concurrency=2, running=2)
    add_jobs(conn, 3, priority=5, run_at=ago("1 second"))  # higher priority, due
    add_jobs(conn, 2, priority=5, run_at=ago("-1 hour"))  # higher, not due: not ahead
    add_jobs(conn, 4, run_at=ago("1 hour"))  # same priority, earlier
    (job,) = add_jobs(conn, run_at=ago("1 minute"))
    add_jobs(conn, 6, run_at=ago("1 minute"))  # same run_at, higher id: behind it
    add_jobs(conn, 2, queue="other", priority=9)  # another queue
    found = why(dsn, job)
    assert [r["code"] for r in found["reasons"]] == ["behind", "slots_busy"]
    behind, busy = found["reasons"]
    assert behind["ahead"] == 7 and behind["at_least"] is False
    assert "7 due jobs of queue default come before it" in behind["message"]
    assert (busy["workers"], busy["slots"], busy["running"]) == (1, 2, 2)


def test_finished_jobs_say_how_they_ended_and_requeue_brings_them_back(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (done,) = add_jobs(conn, status="done", attempts=1, finished_at=ago("1 minute"))
    (failed,) = add_jobs(
        conn,
        status="failed",
        attempts=3,
        finished_at=ago("1 minute"),
        last_error="timed out after 30s",
    )
    (cancelled,) = add_jobs(
        conn, status="cancelled", finished_at=ago("1 minute"), last_error="cancelled: wrong data"
    )
    (ended,) = why(dsn, done)["reasons"]
    assert ended["code"] == "done" and ended["command"] is None
    (gave_up,) = why(dsn, failed)["reasons"]
    assert gave_up["code"] == "failed" and (gave_up["tries"], gave_up["max_attempts"]) == (3, 3)
    assert "after try 3 of 3: timed out after 30s" in gave_up["message"]
    (stopped,) = why(dsn, cancelled)["reasons"]
    assert stopped["code"] == "cancelled" and "wrong data" in stopped["message"]
    run_command(dsn, gave_up["command"])
    run_command(dsn, stopped["command"])
    assert why(dsn, failed)["status"] == "pending" and why(dsn, cancelled)["status"] == "pending"


def test_a_running_job_names_its_worker_and_once_that_worker_is_killed_the_reap_to_run(
    dsn: str, conn: psycopg.Connection[Any], start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    (sleeper,) = insert_jobs(dsn, [["sleep", "60"]])
    worker = start_pgqctl("worker", "--dsn", dsn, "--concurrency", "1", "--heartbeat", "1")
    wait_until(lambda: why(dsn, sleeper)["status"] == "running", 30, "the job to start")
    (behind,) = insert_jobs(dsn, [["true"]])
    wait_until(lambda: "slots_busy" in codes(dsn, behind), 10, "a heartbeat counting the busy slot")
    running = why(dsn, sleeper)["reasons"]
    assert [r["code"] for r in running] == ["running"]
    assert running[0]["worker"].endswith(f":{worker.pid}")
    assert running[0]["slot"] == "0" and 250 < running[0]["lease_left"] <= 300
    assert 0 <= running[0]["claimed_ago"] < 60 and " since " in running[0]["message"]

    worker.kill()  # kill -9: no clean stop, the lease stays
    wait_until(lambda: codes(dsn, sleeper) == ["holder_gone"], 15, "the worker to go stale")
    gone = reason(dsn, sleeper, "holder_gone")
    assert gone["state"] == "stale" and gone["seen_ago"] >= 3
    assert gone["command"] == f"pgqctl reap --worker {gone['worker']}"
    assert "no active worker" in reason(dsn, behind, "no_worker")["message"]
    run_command(dsn, gone["command"])
    assert why(dsn, sleeper)["status"] == "pending"


def test_an_expired_lease_names_reap(dsn: str, conn: psycopg.Connection[Any]) -> None:
    register(conn, "h:1")
    (job,) = add_jobs(
        conn, status="running", attempts=1, locked_by="h:1:0", locked_until=ago("2 minutes")
    )
    found = why(dsn, job)
    assert [r["code"] for r in found["reasons"]] == ["running", "lease_expired"]
    expired = found["reasons"][1]
    assert 110 < -expired["lease_left"] < 200 and expired["command"] == "pgqctl reap"
    run_command(dsn, "pgqctl reap")
    assert why(dsn, job)["status"] == "pending"


def test_the_human_form_gives_each_reason_and_its_command_with_names_on_one_line(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job,) = add_jobs(conn, queue="evil\nCRITICAL fake", run_at=ago("-1 hour"))
    result = run_cli("why", str(job), "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"job {job} (test, queue evil\\x0aCRITICAL fake) is pending"
    assert lines[1].startswith("- it is not due until ")
    assert lines[2] == f"  pgqctl requeue --id {job}"
    assert lines[3].startswith("- no active worker takes queue evil\\x0aCRITICAL fake")
    assert lines[4] == "  pgqctl worker --queue $'evil\\x0aCRITICAL fake'"
    assert len(lines) == 5
    # Pasted into a shell, the command names the queue as it is.
    pasted = subprocess.run(
        ["bash", "-c", "printf %s " + lines[4].split("--queue ", 1)[1]],
        capture_output=True,
        text=True,
        check=True,
    )
    assert pasted.stdout == "evil\nCRITICAL fake"


def test_an_unknown_job_exits_1_with_where_to_look(dsn: str) -> None:
    result = run_cli("why", "424242", "--dsn", dsn)
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "pgqctl: error: job 424242 not found in schema public: `pgqctl list` shows the jobs there"
    )
    assert result.stdout == ""


def test_why_answers_quickly_behind_a_large_backlog(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    register(conn, "h:1")
    add_jobs(conn, 30_000, run_at=ago("1 hour"))
    (job,) = add_jobs(conn, run_at=ago("1 minute"))
    conn.execute("ANALYZE jobs")
    started = time.monotonic()
    behind = reason(dsn, job, "behind")
    assert behind["ahead"] == 10_000 and behind["at_least"] is True
    assert "at least 10,000 due jobs" in behind["message"]
    assert time.monotonic() - started < 30  # bounded: two walks of at most 10,000 entries each
