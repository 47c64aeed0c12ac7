"""`pgqctl requeue` as an operator runs it: failed jobs back to pending, and as a
control, pending jobs made due now and failed ones replayed throttled (--limit,
--spread), all in one statement.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, expired, snapshot


def failed_minutes_ago(
    conn: psycopg.Connection[Any], minutes: list[int], **columns: Any
) -> list[int]:
    """Failed jobs, one per entry, each finished that many minutes ago."""
    return [
        add_jobs(conn, status="failed", attempts=3, finished_at=ago(f"{m} minutes"), **columns)[0]
        for m in minutes
    ]


def when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def status_of(conn: psycopg.Connection[Any]) -> dict[int, str]:
    return dict(conn.execute("SELECT id, status FROM jobs").fetchall())


def test_requeue_narrows_by_kind_queue_and_since(dsn: str, conn: psycopg.Connection[Any]) -> None:
    recent = add_jobs(conn, 2, kind="mail", status="failed", attempts=3)
    (old,) = add_jobs(conn, kind="mail", status="failed", attempts=3, finished_at=ago("2 days"))
    (other_queue,) = add_jobs(conn, kind="mail", queue="bulk", status="failed", attempts=3)
    (other_kind,) = add_jobs(conn, kind="sms", status="failed", attempts=3)

    moved = cli_json(dsn, "requeue", "--kind", "mail", "--queue", "default", "--since", "1h")
    assert [j["id"] for j in moved] == recent
    assert {(j["status"], j["attempts"], j["max_attempts"]) for j in moved} == {("pending", 3, 4)}
    rows = conn.execute(
        "SELECT id, status, finished_at IS NULL, run_at <= now() FROM jobs ORDER BY id"
    ).fetchall()
    assert rows == [
        (recent[0], "pending", True, True),
        (recent[1], "pending", True, True),
        (old, "failed", False, True),
        (other_queue, "failed", False, True),
        (other_kind, "failed", False, True),
    ]

    again = cli_json(dsn, "requeue", "--failed", "--attempts", "3")
    assert [(j["id"], j["max_attempts"]) for j in again] == [
        (old, 6),
        (other_queue, 6),
        (other_kind, 6),
    ]


def test_requeue_keeps_attempts_and_the_last_error(dsn: str, conn: psycopg.Connection[Any]) -> None:
    (job_id,) = add_jobs(
        conn, status="failed", attempts=5, max_attempts=5, last_error="boom", locked_by="w:1:0"
    )
    (moved,) = cli_json(dsn, "requeue", "--id", str(job_id), "--attempts", "2")
    assert (moved["attempts"], moved["max_attempts"], moved["last_error"]) == (5, 7, "boom")
    assert moved["locked_by"] == "w:1:0"  # who ran it last, until another worker claims it


def test_requeue_id_of_a_job_it_does_not_take_says_which_it_takes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (failed,) = add_jobs(conn, status="failed", attempts=3)
    (running,) = expired(conn)
    (done,) = add_jobs(conn, status="done", attempts=1)
    (pending,) = add_jobs(conn)
    result = run_cli(
        "requeue", "--id", str(failed), "--id", str(running), "--id", str(done), "--json",
        "--dsn", dsn,
    )  # fmt: skip
    assert result.exit_code == 0
    assert [j["id"] for j in json.loads(result.stdout)] == [failed]
    for job_id, status in [(running, "running"), (done, "done")]:
        takes = "requeue takes pending, failed and cancelled jobs"
        assert f"job {job_id} is {status}: {takes}; left as it is" in result.stderr
    # A status given narrows what an --id may be.
    only_failed = run_cli("requeue", "--failed", "--id", str(pending), "--dsn", dsn)
    assert only_failed.exit_code == 0
    assert f"job {pending} is pending, not failed: left as it is" in only_failed.stderr

    missing = run_cli("requeue", "--id", "999999", "--dsn", dsn)
    assert missing.exit_code == 1
    assert "job 999999 not found" in missing.stderr


def test_requeue_dry_run_shows_what_would_move_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, status="failed", attempts=3)
    before = snapshot(conn)
    preview = cli_json(dsn, "requeue", "--failed", "--dry-run")
    assert [(j["status"], j["max_attempts"]) for j in preview] == [("pending", 4)] * 3
    assert snapshot(conn) == before


# --- --spread and --limit -------------------------------------------------------------


def test_spread_sets_run_at_evenly_over_the_window_oldest_first(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    n, window = 50, 600.0
    # Finished in a shuffled order, so that id order and finished order differ.
    minutes = [(i * 17) % n + 1 for i in range(n)]
    ids = failed_minutes_ago(conn, minutes, kind="webhook")
    oldest_first = [job_id for _, job_id in sorted(zip(minutes, ids, strict=True), reverse=True)]
    (before,) = conn.execute("SELECT now()").fetchone() or ()

    moved = cli_json(dsn, "requeue", "--failed", "--kind", "webhook", "--spread", "10m")

    (after,) = conn.execute("SELECT now()").fetchone() or ()
    assert [j["id"] for j in moved] == oldest_first  # listed in run_at order
    rows = dict(conn.execute("SELECT id, run_at FROM jobs WHERE status = 'pending'").fetchall())
    run_at = [rows[job_id] for job_id in oldest_first]
    assert before <= run_at[0] <= after
    step = window / n
    for i, t in enumerate(run_at):
        assert abs((t - run_at[0]).total_seconds() - i * step) < 1e-5, i
    assert (run_at[-1] - run_at[0]).total_seconds() < window


def test_limit_takes_the_oldest_finished_first_and_dry_run_shows_the_same(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    recent, oldest, middle, old = failed_minutes_ago(conn, [1, 40, 10, 20])
    before = snapshot(conn)

    preview = cli_json(dsn, "requeue", "--failed", "--limit", "2", "--spread", "1h", "--dry-run")
    assert snapshot(conn) == before
    moved = cli_json(dsn, "requeue", "--failed", "--limit", "2", "--spread", "1h")

    assert [j["id"] for j in preview] == [j["id"] for j in moved] == [oldest, old]
    for shown, done in zip(preview, moved, strict=True):
        assert (shown["status"], shown["max_attempts"]) == (done["status"], done["max_attempts"])
    # The same offsets within the window, each from its own now().
    gap = [when(j["run_at"]) for j in preview], [when(j["run_at"]) for j in moved]
    assert gap[0][1] - gap[0][0] == gap[1][1] - gap[1][0] == dt.timedelta(minutes=30)
    status = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
    assert status == {recent: "failed", oldest: "pending", middle: "failed", old: "pending"}


def test_dry_run_lists_the_run_at_each_job_would_get(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    failed_minutes_ago(conn, [3, 2, 1])
    result = run_cli(
        "requeue", "--failed", "--spread", "90s", "--dry-run", "--format", "plain", "--dsn", dsn
    )
    assert result.exit_code == 0, result.stderr
    header, _, *lines = result.stdout.splitlines()
    assert header.split() == ["id", "queue", "kind", "status", "attempt", "run_at", "error"]
    times = [dt.datetime.fromisoformat(" ".join(line.split()[5:7])) for line in lines]
    assert [(t - times[0]).total_seconds() for t in times] == [0.0, 30.0, 60.0]
    assert "would requeue 3 jobs, run_at spread over 1m30s" in result.stderr


# --- pending jobs: run now -------------------------------------------------------------


def test_requeue_id_of_a_delayed_job_makes_it_due_now_and_a_burst_worker_runs_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    enqueued = run_cli("enqueue", "report", '{"argv": ["true"]}', "--delay", "1h", "--dsn", dsn)
    job_id = int(enqueued.stdout)
    idle = run_cli("worker", "--burst", "--dsn", dsn)
    assert idle.exit_code == 0
    assert conn.execute("SELECT status FROM jobs").fetchone() == ("pending",)

    (moved,) = cli_json(dsn, "requeue", "--id", str(job_id))
    assert (moved["id"], moved["status"], moved["attempts"], moved["max_attempts"]) == (
        job_id,
        "pending",
        0,
        3,
    )
    assert conn.execute("SELECT run_at <= now() FROM jobs").fetchone() == (True,)

    ran = run_cli("worker", "--burst", "--dsn", dsn)
    assert ran.exit_code == 0, ran.stderr
    assert conn.execute("SELECT status, attempts FROM jobs").fetchone() == ("done", 1)


def test_requeue_pending_narrows_and_never_delays_a_job(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (delayed,) = add_jobs(conn, kind="report", run_at=ago("-2 hours"), attempts=1, max_attempts=5)
    (overdue,) = add_jobs(conn, kind="report", run_at=ago("10 minutes"))
    (other_kind,) = add_jobs(conn, kind="mail", run_at=ago("-2 hours"))
    (failed,) = add_jobs(conn, kind="report", status="failed", attempts=3)
    before = dict(conn.execute("SELECT id, run_at FROM jobs").fetchall())

    moved = cli_json(dsn, "requeue", "--pending", "--kind", "report")

    assert [j["id"] for j in moved] == [overdue, delayed]  # the overdue one keeps its place
    rows = {
        r[0]: r[1:]
        for r in conn.execute(
            "SELECT id, status, attempts, max_attempts, run_at <= now() FROM jobs"
        )
    }
    assert rows[delayed] == ("pending", 1, 5, True)
    assert rows[failed][0] == "failed"
    after = dict(conn.execute("SELECT id, run_at FROM jobs").fetchall())
    assert after[overdue] == before[overdue] and after[other_kind] == before[other_kind]


def test_requeue_pending_with_a_spread_staggers_a_delayed_backlog(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    ids = add_jobs(conn, 4, run_at=ago("-1 day"))
    moved = cli_json(dsn, "requeue", "--pending", "--spread", "4m")
    assert [j["id"] for j in moved] == ids
    times = [when(j["run_at"]) for j in moved]
    assert [(t - times[0]).total_seconds() for t in times] == [0.0, 60.0, 120.0, 180.0]


# --- unique keys ------------------------------------------------------------------------


def test_a_failed_job_whose_key_is_held_stays_failed(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (held,) = failed_minutes_ago(conn, [5], unique_key="a")
    (holder,) = add_jobs(conn, unique_key="a")
    first, second = failed_minutes_ago(conn, [9, 3], unique_key="b")
    result = run_cli("requeue", "--failed", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert [j["id"] for j in json.loads(result.stdout)] == [first]  # the oldest of key b
    assert f"job {held} left as it is: job {holder} holds its unique key 'a'" in result.stderr
    assert f"job {second} left as it is: job {first} holds its unique key 'b'" in result.stderr
    status = dict(conn.execute("SELECT id, status FROM jobs").fetchall())
    assert status == {held: "failed", holder: "pending", first: "pending", second: "failed"}


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--failed", "--spread", "0s"], "--spread needs a window longer than 0"),
        (["--failed", "--spread", "10"], "has no unit"),
        (["--failed", "--limit", "many"], "--limit"),
        (["--limit", "5"], "nothing selected"),
    ],
)
def test_bad_requeue_input_exits_2_and_changes_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    failed_minutes_ago(conn, [1])
    before = snapshot(conn)
    result = run_cli("requeue", *args, "--dsn", dsn)
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert snapshot(conn) == before


def test_requeue_grants_tries_from_the_tries_used_in_the_preview_too(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Five claims, two of them handed back by stopping workers: three tries used.
    (job_id,) = add_jobs(conn, status="failed", attempts=5, handbacks=2, max_attempts=3)
    (shown,) = cli_json(dsn, "requeue", "--id", str(job_id), "--attempts", "2", "--dry-run")
    (moved,) = cli_json(dsn, "requeue", "--id", str(job_id), "--attempts", "2")
    assert (shown["max_attempts"], moved["max_attempts"], moved["attempts"]) == (5, 5, 5)


def test_cancelled_jobs_come_back_with_requeue_cancelled_or_by_id(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    first, second, kept = add_jobs(conn, 3, kind="report", run_at=ago("-1 hour"))
    cancelled = cli_json(dsn, "cancel", "--kind", "report", "--reason", "wrong customer")
    assert sorted(j["id"] for j in cancelled) == [first, second, kept]

    # --failed does not take them; --cancelled does, narrowed like the others.
    assert run_cli("requeue", "--failed", "--dsn", dsn).exit_code == 0
    assert status_of(conn)[first] == "cancelled"
    [back] = cli_json(dsn, "requeue", "--cancelled", "--id", str(first))
    [also] = cli_json(dsn, "requeue", "--id", str(second), "--attempts", "2")
    assert (back["id"], back["status"], also["id"], also["status"]) == (
        first,
        "pending",
        second,
        "pending",
    )
    rows = {
        r[0]: r[1:] for r in conn.execute("SELECT id, status, finished_at, max_attempts FROM jobs")
    }
    assert rows[first][1] is None and rows[second][2] == 2
    assert rows[kept][0] == "cancelled"
    # Due now, and the next run is a worker's to take.
    ran = run_cli("worker", "--burst", "--dsn", dsn)
    assert ran.exit_code == 0, ran.stderr
    assert status_of(conn) == {first: "done", second: "done", kept: "cancelled"}
