"""`pgqctl check` against a real PostgreSQL: the thresholds a queue is held to,
its exit codes, and the index it reads through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg

from pgqctl.jobs import FINISHED
from pgqctl.sql import query
from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, ago, expired
from tests.support.servers import closed_port_dsn


def check(dsn: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = run_cli("check", "--dsn", dsn, *args, env=env)
    assert result.exit_code in (0, 3), result.stderr
    return result.exit_code, result.stdout.splitlines()


def busy_queue(conn: psycopg.Connection[Any], queue: str = "emails") -> None:
    """A queue that is working: a job due now, one running, one done a minute ago."""
    add_jobs(conn, 1, queue=queue)
    add_jobs(conn, 1, queue=queue, status="running", attempts=1, locked_until=ago("-5 minutes"))
    add_jobs(conn, 1, queue=queue, status="done", attempts=1, finished_at=ago("1 minute"))


def _scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node["Node Type"].endswith("Scan"):
        yield node
    for child in node.get("Plans", []):
        yield from _scans(child)


def test_check_says_nothing_and_exits_0_on_a_healthy_queue(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    busy_queue(conn)
    every = ["--max-pending-age", "5m", "--max-pending", "10", "--max-failed", "0"]
    every += ["--max-expired-leases", "0", "--max-running-age", "1h", "--stalled", "10m"]
    assert check(dsn) == (0, [])
    assert check(dsn, *every) == (0, [])


def test_check_prints_one_line_per_breach_and_exits_3(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails", run_at=ago("2 hours"), created_at=ago("2 hours"))
    add_jobs(conn, 1, queue="emails", status="done", attempts=1, finished_at=ago("1 minute"))
    add_jobs(conn, 2, queue="sms", status="failed", attempts=3)
    expired(conn, 1, queue="sms")
    add_jobs(
        conn,
        1,
        queue="sms",
        status="running",
        attempts=1,
        run_at=ago("3 hours"),
        claimed_at=ago("2 hours"),  # it waited an hour for a worker: that is not run time
        locked_until=ago("-5 minutes"),
    )
    add_jobs(conn, 1, queue="quiet")  # due now: holds everything
    code, lines = check(
        dsn,
        *("--max-pending-age", "5m", "--max-pending", "2", "--max-failed", "0"),
        *("--max-expired-leases", "0", "--max-running-age", "1h", "--stalled", "10m"),
    )
    assert code == 3
    assert lines == [
        "CRITICAL emails: oldest pending job waited 2h (max 5m)",
        "CRITICAL emails: 3 pending jobs (max 2)",
        "CRITICAL sms: 2 failed jobs (max 0)",
        "CRITICAL sms: 1 expired lease (max 0)",
        "CRITICAL sms: oldest running job has run 2h (max 1h)",
    ]
    # Each threshold alone: its own lines only.
    assert check(dsn, "--max-pending", "2") == (3, ["CRITICAL emails: 3 pending jobs (max 2)"])
    assert check(dsn, "--max-pending", "3") == (0, [])  # above the threshold, not at it


def test_check_finds_a_stalled_queue_whose_jobs_wait_and_none_finishes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # The 32-hour stall: due jobs waiting, the queue depth looking normal.
    add_jobs(conn, 5, queue="emails", run_at=ago("32 hours"), created_at=ago("32 hours"))
    # Work elsewhere, and long ago here, proves nothing about this queue now.
    add_jobs(conn, 3, queue="sms", status="done", attempts=1, finished_at=ago("1 minute"))
    add_jobs(conn, 3, queue="emails", status="done", attempts=1, finished_at=ago("20 minutes"))
    stalled = [
        "CRITICAL emails: stalled: due jobs waited 1d08h and no job finished in 10m"
        " (stalled after 10m)"
    ]
    assert check(dsn) == (3, stalled)  # --stalled 10m is a default
    assert check(dsn, "--stalled", "10m") == (3, stalled)
    assert check(dsn, "--stalled", "15m")[0] == 3
    # A job of the queue finished within the window: it moves, slowly.
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3, finished_at=ago("5 minutes"))
    assert check(dsn, "--stalled", "10m") == (0, [])
    assert check(dsn, "--stalled", "4m")[0] == 3


def test_check_applies_the_defaults_only_when_no_threshold_is_given(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expired(conn, 2, queue="emails")
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3)
    assert check(dsn) == (3, ["CRITICAL emails: 2 expired leases (max 0)"])
    # Given one, only that one applies.
    assert check(dsn, "--max-failed", "0") == (3, ["CRITICAL emails: 1 failed job (max 0)"])
    assert check(dsn, "--max-expired-leases", "2") == (0, [])
    # Thresholds may come from the environment (a cron line's settings)...
    env = {"PGQCTL_MAX_EXPIRED_LEASES": "5"}
    assert check(dsn, env=env) == (0, [])


def test_check_holds_each_queue_on_its_own_or_only_those_named(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails")
    add_jobs(conn, 3, queue="sms")
    add_jobs(conn, 1, queue="billing")
    code, lines = check(dsn, "--max-pending", "2")
    assert (code, lines) == (
        3,
        ["CRITICAL emails: 3 pending jobs (max 2)", "CRITICAL sms: 3 pending jobs (max 2)"],
    )
    assert check(dsn, "--max-pending", "2", "--queue", "sms") == (
        3,
        ["CRITICAL sms: 3 pending jobs (max 2)"],
    )
    assert check(dsn, "--max-pending", "2", "--queue", "billing") == (0, [])
    # ...but never which queues: a worker's PGQCTL_QUEUE does not narrow a check.
    assert check(dsn, "--max-pending", "2", env={"PGQCTL_QUEUE": "billing"})[0] == 3
    # A named queue with no jobs is still checked, its figures zero.
    result = run_cli("check", "--dsn", dsn, "--queue", "nothing", "--json")
    assert result.exit_code == 0, result.stderr
    (queue,) = json.loads(result.stdout)["queues"]
    assert queue["queue"] == "nothing"
    assert queue["figures"]["pending"]["value"] == 0
    assert queue["figures"]["expired_leases"] == {
        "value": 0,
        "threshold": 0,
        "option": "--max-expired-leases",
        "ok": True,
    }


def test_check_json_gives_every_figure_its_threshold_and_whether_it_holds(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails", run_at=ago("2 hours"))
    add_jobs(conn, 1, queue="emails", status="done", attempts=1, finished_at=ago("1 minute"))
    result = run_cli(
        "check", "--dsn", dsn, "--json", "--max-pending-age", "5m", "--max-pending", "10"
    )
    assert result.exit_code == 3, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["thresholds"] == {"max_pending_age": 300.0, "max_pending": 10}
    assert data["breaches"] == ["CRITICAL emails: oldest pending job waited 2h (max 5m)"]
    (queue,) = data["queues"]
    figures = queue["figures"]
    assert queue["queue"] == "emails" and queue["ok"] is False
    assert set(figures) == {
        "oldest_pending_age_seconds",
        "pending",
        "failed",
        "expired_leases",
        "oldest_running_age_seconds",
        "stalled_seconds",
        "active_workers",
    }
    age = figures["oldest_pending_age_seconds"]
    assert 7200 <= age["value"] < 7300
    assert (age["threshold"], age["option"], age["ok"]) == (300.0, "--max-pending-age", False)
    assert figures["pending"] == {
        "value": 3,
        "threshold": 10,
        "option": "--max-pending",
        "ok": True,
    }
    # Figures with no threshold applied are measured, and hold.
    assert figures["failed"] == {
        "value": 0,
        "threshold": None,
        "option": "--max-failed",
        "ok": True,
    }
    # No worker registered: none serves it (a minimum breached only when given).
    assert figures["active_workers"] == {
        "value": 0,
        "threshold": None,
        "option": "--min-workers",
        "ok": True,
    }
    # Without --stalled the window's finished jobs are not read.
    assert figures["stalled_seconds"]["value"] is None and queue["finished_in_window"] is None
    healthy = run_cli("check", "--dsn", dsn, "--json", "--stalled", "10m")
    assert healthy.exit_code == 0
    data = json.loads(healthy.stdout)
    assert data["ok"] is True and data["breaches"] == []
    assert data["queues"][0]["finished_in_window"] == 1


def test_check_that_cannot_check_exits_1_and_never_says_ok(empty_dsn: str) -> None:
    for target in (closed_port_dsn(), empty_dsn):
        for fmt in ([], ["--json"]):
            result = run_cli("check", "--dsn", target, *fmt)
            assert result.exit_code == 1, result.stderr
            assert result.stdout == ""
            (line,) = result.stderr.splitlines()
            assert line.startswith("pgqctl: error: ")
    assert "pgqctl migrate" in run_cli("check", "--dsn", empty_dsn).stderr


def test_check_refuses_a_duration_without_a_unit(dsn: str) -> None:
    result = run_cli("check", "--dsn", dsn, "--stalled", "10")
    assert result.exit_code == 2
    assert "no unit" in result.stderr


def test_the_window_of_finished_jobs_is_read_through_the_index(
    conn: psycopg.Connection[Any],
) -> None:
    # A long history finished before the window: the plan reads the window's
    # range of jobs_finished_idx, never the history (as a scan would).
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, status, attempts, finished_at) "
        "SELECT 'q', 'k', '{}', 'done', 1, now() - interval '30 days' + i * interval '1 s' "
        "FROM generate_series(1, 20000) AS i"
    )
    # And in the history, the days before the window: never read.
    conn.execute(
        "SELECT pgqctl_history_add_days((now() AT TIME ZONE 'UTC')::date - 31,"
        " (now() AT TIME ZONE 'UTC')::date - 1);"
        "WITH m AS (DELETE FROM jobs WHERE id % 2 = 0 RETURNING *)"
        " INSERT INTO jobs_history SELECT * FROM m"
    )
    conn.execute("ANALYZE jobs")
    text = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("monitor_finished_since")
    today = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')").fetchone()[0]
    (since,) = conn.execute("SELECT now() - interval '10 minutes'").fetchone()
    for status in FINISHED:
        params = {"status": status, "since": since}
        ((plan,),) = conn.execute(text, params).fetchall()
        scans = list(_scans(plan[0]["Plan"]))
        in_jobs = [s for s in scans if s["Relation Name"] == "jobs"]
        assert [s.get("Index Name") for s in in_jobs] == ["jobs_finished_idx"], scans
        # The range of the window only: a few pages, not the index's hundred.
        assert "status" in in_jobs[0]["Index Cond"], scans
        assert in_jobs[0]["Actual Rows"] == 0 and in_jobs[0]["Shared Hit Blocks"] < 10, scans
        # The history's days of done jobs from the window's on (an empty
        # one ahead of the clock costs nothing); the failed or cancelled
        # jobs' table.
        days = [s["Relation Name"] for s in scans if s["Relation Name"] != "jobs"]
        if status == "done":
            assert days and all(
                d.startswith("jobs_history_done_") and d[-8:] >= today for d in days
            ), days
        else:
            assert days == [f"jobs_history_{status}"], days
