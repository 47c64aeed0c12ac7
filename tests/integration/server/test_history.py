"""The history of finished jobs, in partitions by status and day apart from
jobs: every command reads a job there as it reads it in jobs, a requeue
brings one back, and a purge drops whole days."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from pgqctl import db, history
from pgqctl.sql import query
from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, mixed_queues
from tests.support.roles import app_role


def move_to_history(dsn: str) -> int:
    """Move every finished job, with its attempts, from jobs into the
    history, as a worker does (the days they need are made); how many moved."""
    with db.connect(dsn, schema="public") as conn:
        moved = history.move(conn, 0.0, budget=60.0)
    assert not moved.more
    return moved.jobs


def add_attempt(conn: psycopg.Connection[Any], job_id: int, claim: int, output: str) -> None:
    conn.execute(
        "INSERT INTO attempts (job_id, claim, attempt, outcome, finished_at, recorded_by, "
        "stdout_head, stdout_bytes) SELECT id, %s, %s, 'failed', finished_at, 'worker', %s, %s "
        "FROM jobs WHERE id = %s",
        (claim, claim, output, len(output), job_id),
    )


def outputs(dsn: str, done_id: int, failed_id: int) -> dict[str, Any]:
    """What the reading commands say, without the figures that age by the second."""
    stats = cli_json(dsn, "stats")
    for counts in [stats, *stats["queues"]]:
        counts.pop("oldest_pending_age_seconds", None)
    requeue = cli_json(dsn, "requeue", "--failed", "--dry-run")
    for job in requeue:
        job.pop("run_at")  # due now
    return {
        "list": cli_json(dsn, "list", "--limit", "100"),
        "list_done": cli_json(dsn, "list", "--status", "done"),
        "list_failed_sms": cli_json(dsn, "list", "--status", "failed", "--queue", "sms"),
        "list_since": cli_json(dsn, "list", "--since", "1h"),
        "list_kind": cli_json(dsn, "list", "--kind", "test", "--limit", "3"),
        "show_done": cli_json(dsn, "show", str(done_id)),
        "logs_done": cli_json(dsn, "logs", str(done_id)),
        "logs_failed": cli_json(dsn, "logs", str(failed_id), "--attempt", "1"),
        "attempts_dry_run": cli_json(dsn, "purge", "--attempts-older-than", "0s", "--dry-run"),
        "show_failed": cli_json(dsn, "show", str(failed_id)),
        "why_done": cli_json(dsn, "why", str(done_id)),
        "stats": stats,
        "failures": cli_json(dsn, "failures"),
        "purge_dry_run": cli_json(dsn, "purge", "--status", "all", "--dry-run"),
        "requeue_dry_run": requeue,
    }


def test_every_command_reads_a_job_in_the_history_as_it_read_it_in_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    mixed_queues(conn)
    (cancelled,) = add_jobs(conn, status="cancelled", finished_at=ago("1 minute"))
    done_id = conn.execute("SELECT max(id) FROM jobs WHERE status = 'done'").fetchone()[0]
    failed_id = conn.execute("SELECT max(id) FROM jobs WHERE status = 'failed'").fetchone()[0]
    conn.execute(
        "UPDATE jobs SET last_error = 'invoice ' || id || ' has no customer' "
        "WHERE status = 'failed'"
    )
    add_attempt(conn, done_id, 1, "sent\n")
    add_attempt(conn, failed_id, 1, "no customer\n")
    add_attempt(conn, failed_id, 2, "still none\n")
    before = outputs(dsn, done_id, failed_id)

    assert move_to_history(dsn) == 11
    assert conn.execute("SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL").fetchone() == (
        0,
    )
    assert conn.execute("SELECT count(*) FROM jobs_history").fetchone() == (11,)
    # Their attempts moved with them.
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM attempts_history").fetchone() == (3,)

    after = outputs(dsn, done_id, failed_id)
    for name in before:
        assert after[name] == before[name], name
    assert any(j["id"] == cancelled for j in after["list"])


def test_a_requeue_brings_a_failed_job_back_from_the_history_under_its_id(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    failed = add_jobs(
        conn, 2, status="failed", attempts=3, max_attempts=3, finished_at=ago("1 hour")
    )
    (kept,) = add_jobs(conn, status="done", attempts=1, finished_at=ago("1 hour"))
    add_attempt(conn, failed[0], 3, "out of tries\n")
    move_to_history(dsn)

    result = cli_json(dsn, "requeue", "--failed", "--attempts", "2")
    assert sorted(j["id"] for j in result) == failed
    rows = conn.execute(
        "SELECT id, status, attempts, max_attempts, finished_at FROM jobs ORDER BY id"
    ).fetchall()
    # attempts, the fencing token, is kept; the tries granted come on top.
    assert rows == [(i, "pending", 3, 5, None) for i in failed]
    assert [r[0] for r in conn.execute("SELECT id FROM jobs_history")] == [kept]
    # Its attempts came back with it.
    assert conn.execute("SELECT job_id, claim FROM attempts").fetchall() == [(failed[0], 3)]
    assert conn.execute("SELECT count(*) FROM attempts_history").fetchone() == (0,)
    assert [j["id"] for j in cli_json(dsn, "list", "--status", "pending")] == failed[::-1]
    # Nothing left in the history to requeue.
    assert cli_json(dsn, "requeue", "--failed") == []


def test_a_requeue_keeps_the_record_a_late_worker_made_after_the_job_moved(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = add_jobs(conn, status="failed", attempts=1, max_attempts=1, finished_at=ago("1h"))
    add_attempt(conn, job_id, 1, "reaped\n")
    move_to_history(dsn)
    # The worker of claim 1 reports after the move: its record goes to
    # attempts, beside the history's record of the same claim.
    add_attempt_row = (
        "INSERT INTO attempts (job_id, claim, attempt, outcome, finished_at, late, "
        "recorded_by, stdout_head, stdout_bytes) "
        "VALUES (%s, 1, 1, 'failed', now(), true, 'worker', 'late\n', 5)"
    )
    conn.execute(add_attempt_row, (job_id,))
    assert [j["id"] for j in cli_json(dsn, "requeue", "--id", str(job_id))] == [job_id]
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone() == (
        "pending",
    )
    assert conn.execute("SELECT claim, stdout_head FROM all_attempts").fetchall() == [(1, "late\n")]


def test_a_requeue_finds_a_job_a_worker_moved_while_it_waited_for_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (job_id,) = add_jobs(conn, status="failed", attempts=1, max_attempts=1, finished_at=ago("1h"))
    with db.connect(dsn, schema="public") as mover:
        history.keep_ahead(mover)
        with mover.transaction():
            # A move of the job, not yet committed: its row in jobs is gone
            # for the move and locked; the history's copy is not visible yet.
            mover.execute(
                query("history_move_batch"),
                {
                    "status": "failed",
                    "cutoff": dt.datetime.now(dt.timezone.utc),
                    "floor": history.FLOOR,
                    "batch_size": 10,
                },
            )
            result: dict[str, Any] = {}
            requeue = threading.Thread(
                target=lambda: result.update(
                    out=run_cli("requeue", "--id", str(job_id), "--json", "--dsn", dsn)
                )
            )
            requeue.start()
            time.sleep(1.0)  # the requeue waits for the row the move holds
            assert requeue.is_alive()
        requeue.join(30)
    out = result["out"]
    assert out.exit_code == 0, out.stderr
    assert [j["id"] for j in json.loads(out.stdout)] == [job_id]
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone() == (
        "pending",
    )
    assert conn.execute("SELECT count(*) FROM jobs_history").fetchone() == (0,)


def partitions(conn: psycopg.Connection[Any], of: str = "jobs_history") -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_partition_tree(%s) AS t "
        "JOIN pg_class AS c ON c.oid = t.relid WHERE t.isleaf",
        (of,),
    )
    return {r[0] for r in rows}


def attempt_partitions(conn: psycopg.Connection[Any]) -> set[str]:
    return partitions(conn, "attempts_history")


def test_purge_drops_the_days_before_its_cutoff_whole_and_deletes_within_a_day(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    (now,) = conn.execute("SELECT now()").fetchone()
    today = now.astimezone(dt.timezone.utc).date()
    days = [today - dt.timedelta(n) for n in (4, 3, 2)]

    def at(day: dt.date, hour: int) -> dt.datetime:
        return dt.datetime.combine(day, dt.time(hour), dt.timezone.utc)

    old_done = [
        add_jobs(conn, 3, status="done", attempts=1, finished_at=at(d, 12))[0] for d in days
    ]
    old_failed = add_jobs(conn, 2, status="failed", attempts=3, finished_at=at(days[0], 6))
    (recent,) = add_jobs(conn, status="done", attempts=1, finished_at=ago("1 minute"))
    for job_id in old_done:
        add_attempt(conn, job_id, 1, "done\n")
    assert move_to_history(dsn) == 12

    # The cutoff falls in the day before yesterday: the two days before it
    # go whole, that day's rows before the cutoff one by one.
    cutoff_age = now - at(days[2], 12) - dt.timedelta(minutes=1)
    older_than = f"{int(cutoff_age.total_seconds())}s"
    result = run_cli("purge", "--older-than", older_than, "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    out = json.loads(result.stdout)
    assert [d["day"] for d in out["dropped_days"]] == [days[0].isoformat(), days[1].isoformat()]
    assert out["deleted"] == 3  # the third day's, row by row
    assert f"dropped the history's done jobs of {days[0].isoformat()} whole" in result.stderr

    left = {f"jobs_history_done_{d:%Y%m%d}" for d in days[:2]}
    assert not left & partitions(conn)
    # Failed jobs are kept in a table of their own: a purge of done jobs
    # leaves them.
    assert conn.execute("SELECT count(*) FROM jobs_history_failed").fetchone() == (2,)
    remaining = sorted(r[0] for r in conn.execute("SELECT id FROM all_jobs"))
    assert remaining == sorted([*old_failed, recent])
    # The jobs' attempts went with them: their days' partitions, dropped.
    assert conn.execute("SELECT count(*) FROM all_attempts").fetchone() == (0,)
    assert not {f"attempts_history_done_{d:%Y%m%d}" for d in days[:2]} & attempt_partitions(conn)
    # Purge keeps a day ready ahead.
    conn.execute("SELECT pgqctl_history_drop_day((now() AT TIME ZONE 'UTC')::date + 1)")
    assert run_cli("purge", "--dsn", dsn, "--older-than", "30d").exit_code == 0
    ahead = f"{today + dt.timedelta(1):%Y%m%d}"
    assert f"jobs_history_done_{ahead}" in partitions(conn)
    assert f"attempts_history_done_{ahead}" in attempt_partitions(conn)
    # A purge of failed jobs deletes them row by row.
    assert cli_json(dsn, "purge", "--status", "failed") == {"deleted": 2}


def test_a_role_with_table_rights_only_drops_and_makes_days(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with app_role(conn, "pgqctl_history_app", dsn) as app_dsn:
        add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("3 days"))
        move_to_history(dsn)
        out = cli_json(app_dsn, "purge", "--older-than", "2d")
        assert len(out["dropped_days"]) == 1
        assert conn.execute("SELECT count(*) FROM all_jobs").fetchone() == (0,)

        # A role without DELETE on the history cannot drop a day through the function.
        conn.execute("REVOKE DELETE ON jobs_history FROM pgqctl_history_app")
        day = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
        with psycopg.connect(app_dsn, autocommit=True) as app:
            try:
                app.execute("SELECT pgqctl_history_drop_day(%s)", (day,))
            except psycopg.errors.InsufficientPrivilege:
                pass
            else:
                raise AssertionError("the drop went through without DELETE on jobs_history")
        assert f"jobs_history_done_{day:%Y%m%d}" in partitions(conn)


def test_check_and_doctor_say_when_no_worker_moves_finished_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, status="done", attempts=1, finished_at=ago("2 hours"))
    assert run_cli("check", "--dsn", dsn, "--max-unmoved-age", "3h").exit_code == 0
    # Two days and more with no worker moving finished jobs.
    add_jobs(conn, status="failed", attempts=3, finished_at=ago("50 hours"))

    result = run_cli("check", "--dsn", dsn, "--json", "--max-unmoved-age", "1d")
    assert result.exit_code == 3, result.stderr
    out = json.loads(result.stdout)
    assert out["history"]["ok"] is False and out["history"]["unmoved_seconds"] >= 50 * 3600
    (line,) = out["breaches"]
    assert line.startswith("history: a finished job has stayed in jobs for 2d")
    # Without the option, check does not look.
    assert run_cli("check", "--dsn", dsn).exit_code == 0

    doctor = json.loads(run_cli("doctor", "--dsn", dsn, "--json").stdout)
    (finding,) = [f for f in doctor["findings"] if f["kind"] == "history_move"]
    assert finding["figures"]["oldest_finished_in_jobs_seconds"] >= 50 * 3600

    # A worker moves them (it makes the days they need): both are satisfied.
    assert run_cli("worker", "--dsn", dsn, "--burst").exit_code == 0
    assert run_cli("check", "--dsn", dsn, "--max-unmoved-age", "1d").exit_code == 0
    doctor = json.loads(run_cli("doctor", "--dsn", dsn, "--json").stdout)
    assert not [f for f in doctor["findings"] if f["kind"] == "history_move"]
    # The history is one row, with its partitions' rows.
    (kept,) = [t for t in doctor["tables"] if t["table"] == "jobs_history"]
    assert kept["n_live_tup"] == 2, kept


def test_the_newest_page_is_exact_when_the_newest_days_cannot_answer_it(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # list reads the last day first, then every day when that part cannot
    # give the page. Ids 1..60: created three days ago, done today (the
    # newest day). Ids 61..100: created and done two days ago (an older
    # day), yet newer by id: the first page must be theirs.
    late = add_jobs(
        conn, 60, status="done", attempts=1, created_at=ago("3 days"), finished_at=ago("1 hour")
    )
    early = add_jobs(
        conn, 40, status="done", attempts=1, created_at=ago("2 days"), finished_at=ago("2 days")
    )
    move_to_history(dsn)
    newest = sorted(late + early, reverse=True)
    page = cli_json(dsn, "list", "--status", "done")
    assert [j["id"] for j in page] == newest[:50]
    assert [j["id"] for j in cli_json(dsn, "list", "--limit", "5")] == newest[:5]
    # The last day alone holds fewer than a page: the older days fill it.
    conn.execute("DELETE FROM jobs_history WHERE id = ANY(%s)", (late[10:],))
    newest = sorted(late[:10] + early, reverse=True)
    assert [j["id"] for j in cli_json(dsn, "list", "--status", "done")] == newest
    assert cli_json(dsn, "stats")["totals"]["done"] == 50


def test_sessions_making_or_dropping_the_same_days_at_once_all_succeed(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Workers start their moves together (a fleet restarted at once) and
    # each makes the days it needs; two purges from cron can drop the same
    # days. The session that comes second finds the day made, or gone, and
    # goes on, rather than failing its move or its purge.
    sessions, weeks = 4, 10
    today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
    firsts = [today - dt.timedelta(days=7 * (week + 1)) for week in range(weeks)]

    def all_at_once(each: Any) -> list[Any]:
        ready = threading.Barrier(sessions)
        results: list[Any] = []

        def session() -> None:
            with db.connect(dsn, schema="public") as own:
                for first in firsts:
                    ready.wait()
                    try:
                        results.append(each(own, first))
                    except psycopg.Error as exc:
                        results.append(exc)

        threads = [threading.Thread(target=session) for _ in range(sessions)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    made = all_at_once(history.keep_ahead)
    assert [r for r in made if isinstance(r, BaseException)] == []
    # Each day was made once, by whichever session came first (today's and
    # tomorrow's were there already), with its attempts' partition.
    assert sum(made) == 2 * 7 * weeks
    assert len(partitions(conn)) == 7 * weeks + 2 + 2  # and failed, cancelled

    dropped = all_at_once(history.drop_day)
    assert [r for r in dropped if isinstance(r, BaseException)] == []
    assert len([r for r in dropped if r is not None]) == weeks
    assert len(partitions(conn)) == 7 * weeks - weeks + 2 + 2
    assert len(attempt_partitions(conn)) == 7 * weeks - weeks + 2 + 2


def test_the_move_makes_only_the_days_that_hold_jobs_a_month_at_a_time(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Plain SQL can say a job finished in 2001: that needs one day's
    # partition, not every day since (which once made 18,000 tables in one
    # transaction and ran the server out of lock table for every session).
    days_ago = [9000, 4000, *range(40, 0, -1)]
    for n in days_ago:
        add_jobs(conn, 1, status="done", attempts=1, finished_at=ago(f"{n} days"))
    before = len(partitions(conn))
    with db.connect(dsn, schema="public") as own:
        first = history.move(own, 0.0, budget=60.0)
        # 31 days a chore: the two old jobs' days and the first 29 of the rest.
        assert (first.jobs, first.more) == (31, True)
        assert len(partitions(conn)) == before + 31
        second = history.move(own, 0.0, budget=60.0)
    assert (second.jobs, second.more) == (len(days_ago) - 31, False)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    made = partitions(conn)
    today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
    for n in (9000, 4000, 40, 1):
        assert f"jobs_history_done_{today - dt.timedelta(days=n):%Y%m%d}" in made
    assert f"jobs_history_done_{today - dt.timedelta(days=41):%Y%m%d}" not in made
    assert len(made) == before + len(days_ago)


def test_the_locks_a_read_by_id_takes_are_those_the_history_counts(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # doctor warns before reads of a long history could fill the server's
    # lock table: its count must be what PostgreSQL takes, day for day.
    def taken() -> tuple[int, int]:
        with psycopg.connect(dsn) as reader:
            reader.execute("SELECT * FROM all_jobs WHERE id = 1").fetchall()
            reader.execute("SELECT * FROM all_attempts WHERE job_id = 1").fetchall()
            (n,) = reader.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() "
                "AND locktype = 'relation'"
            ).fetchone()
        with db.connect(dsn, schema="public") as own:
            return n, history.read_locks(own).read_locks

    before, counted_before = taken()
    today = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone()[0]
    conn.execute(
        "SELECT pgqctl_history_add_days(%s, %s)",
        (today - dt.timedelta(days=30), today - dt.timedelta(days=1)),
    )
    after, counted_after = taken()
    assert after - before == counted_after - counted_before > 30 * 5
    assert counted_after <= after


def test_doctor_says_when_reads_of_the_history_would_fill_the_lock_table() -> None:
    from pgqctl.doctor import READERS_AT_ONCE, _history_findings

    kept = history.State(None, dt.datetime.now(dt.timezone.utc))
    # 100 connections of 64 locks: 6,400 in all.
    fits = history.ReadLocks(read_locks=700, days=90, max_locks=64, lock_slots=6_400)
    assert _history_findings(kept, fits) == []
    full = history.ReadLocks(read_locks=2_800, days=365, max_locks=64, lock_slots=6_400)
    (finding,) = _history_findings(kept, full)
    assert finding.kind == "history_locks"
    assert "out of shared memory" in finding.summary and "365 days" in finding.summary
    need = -(-2_800 * READERS_AT_ONCE // 100)
    assert finding.sql == (f"ALTER SYSTEM SET max_locks_per_transaction = {need};",)
    assert "purge --older-than" in finding.recommendation


def test_a_schema_whose_name_needs_quoting_drops_its_days_whole(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    schema = "Queue Jobs"
    assert run_cli("migrate", "--schema", schema, "--dsn", dsn).exit_code == 0
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.jobs (kind, payload, status, attempts, finished_at) "
            "SELECT 'k', '{{}}', 'done', 1, now() - i * interval '1 day' "
            "FROM generate_series(3, 5) AS i"
        ).format(sql.Identifier(schema))
    )
    with db.connect(dsn, schema=schema) as own:
        assert history.move(own, 0.0, budget=60.0).jobs == 3
    out = cli_json(dsn, "purge", "--older-than", "1d", "--schema", schema)
    assert len(out["dropped_days"]) == 3 and out["deleted"] == 0


def test_day_bounds_are_utc_midnights_whatever_the_session_shows_dates_as(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # The function writes each bound as text and reads it back: under
    # another DateStyle and time zone, the text must still mean midnight UTC.
    options = "-c datestyle=SQL,DMY -c timezone=Asia/Kolkata"
    with psycopg.connect(dsn, autocommit=True, options=options) as elsewhere:
        elsewhere.execute("SELECT pgqctl_history_add_days('2030-03-01', '2030-03-01')")
    (bound,) = conn.execute(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class "
        "WHERE relname = 'jobs_history_done_20300301'"
    ).fetchone()
    assert bound == "FOR VALUES FROM ('2030-03-01 00:00:00+00') TO ('2030-03-02 00:00:00+00')"


def test_a_purge_waits_for_the_history_as_long_as_its_lock_timeout_says(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("3 days"))
    move_to_history(dsn)
    with psycopg.connect(dsn) as reader:
        # A long read of the history holds its days, which a drop must wait for.
        reader.execute("SELECT count(*) FROM all_jobs").fetchone()
        began = time.monotonic()
        refused = run_cli("purge", "--older-than", "2d", "--lock-timeout", "2s", "--dsn", dsn)
        took = time.monotonic() - began
        assert refused.exit_code == 1, refused.stderr
        assert "2s" in refused.stderr and f"pid {reader.info.backend_pid}" in refused.stderr
        assert 1.5 < took < 10, took

        # With a longer --lock-timeout it waits, and drops the day once the read ends.
        result: dict[str, Any] = {}
        purge = threading.Thread(
            target=lambda: result.update(
                out=run_cli(
                    "purge", "--older-than", "2d", "--lock-timeout", "30s", "--json", "--dsn", dsn
                )
            )
        )
        purge.start()
        time.sleep(3)  # longer than a drop's retries took before
        assert purge.is_alive()
    purge.join(30)
    assert len(json.loads(result["out"].stdout)["dropped_days"]) == 1
