"""Workers move jobs finished --archive-after ago from jobs into the history:
real worker processes, the commands reading the same jobs before and after."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqctl import db, history
from pgqctl.sql import query
from tests.conftest import cli_json, run_cli
from tests.support.jobrows import add_jobs, ago, insert_jobs, sh
from tests.support.plans import PLANS, plan_of, rows_read
from tests.support.processes import start_json_worker, wait_until
from tests.support.roles import app_role

__all__ = ["start_json_worker"]  # a fixture


def ids_in(conn: psycopg.Connection[Any], table: str) -> list[int]:
    rows = conn.execute(sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(table)))
    return [r[0] for r in rows]


def test_a_worker_moves_the_jobs_finished_archive_after_ago_and_no_others(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    old = [
        *add_jobs(conn, 3, status="done", attempts=1, finished_at=ago("2 hours")),
        *add_jobs(conn, 2, status="failed", attempts=3, finished_at=ago("3 days")),
        *add_jobs(conn, 1, status="cancelled", finished_at=ago("90 minutes")),
    ]
    recent = add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("1 minute"))
    # Plain SQL may write a finished_at with no day to go to: it stays.
    (timeless,) = add_jobs(
        conn, status="done", attempts=1, finished_at=sql.SQL("'-infinity'::timestamptz")
    )
    (todo,) = insert_jobs(conn, [{"argv": ["true"]}])
    shown = {i: cli_json(dsn, "show", str(i)) for i in old}

    worker = start_json_worker(dsn, "--burst", "--archive-after", "1h")
    assert worker.wait(60) == 0
    assert worker.events("archived")[0]["jobs"] == 6
    assert ids_in(conn, "jobs_history") == old
    assert ids_in(conn, "jobs") == sorted([*recent, timeless, todo])
    # Every command still reads them as before.
    assert {i: cli_json(dsn, "show", str(i)) for i in old} == shown
    listed = [j["id"] for j in cli_json(dsn, "list", "--limit", "100")]
    assert listed == sorted([*old, *recent, timeless, todo], reverse=True)


def test_a_backlog_moves_in_short_batches_while_the_worker_runs_its_jobs(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    # An installation's history from before the history existed: 30,000 done
    # jobs over 30 days, moved a budget at a time while jobs keep running.
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
        "SELECT 'old', '{}', 'done', 1, now() - i * interval '86 s' "
        "FROM generate_series(1, 30000) AS i"
    )
    worker = start_json_worker(dsn, "--archive-after", "1m", "--poll", "1s")
    began = time.monotonic()
    jobs = insert_jobs(conn, [{"argv": ["true"]}] * 20)
    wait_until(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'done'", (jobs,)
            ).fetchone()
            == (20,)
        ),
        20,
        "the new jobs to be done",
    )
    ran_within = time.monotonic() - began
    wait_until(
        lambda: conn.execute("SELECT count(*) FROM jobs_history").fetchone() == (30000,),
        60,
        "the backlog to move",
    )
    assert worker.stop() == 0
    moves = worker.events("archived")
    assert len(moves) > 1 and sum(m["jobs"] for m in moves) == 30000
    # The jobs did not wait for the backlog.
    assert ran_within < 15, ran_within
    assert conn.execute("SELECT count(*) FROM jobs WHERE kind = 'old'").fetchone() == (0,)
    # A day per partition: 30 days of done jobs, and none of the others.
    days = conn.execute(
        "SELECT count(*) FROM pg_partition_tree('jobs_history_done') AS t "
        "JOIN pg_class AS c ON c.oid = t.relid "
        "WHERE t.isleaf AND EXISTS (SELECT 1 FROM jobs_history_done h WHERE h.tableoid = c.oid)"
    ).fetchone()
    assert days in ((30,), (31,))


def test_a_worker_whose_role_may_not_write_the_history_says_so_once_and_goes_on(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    with app_role(conn, "pgqctl_archive_app", dsn) as app_dsn:
        conn.execute("REVOKE INSERT ON jobs_history FROM pgqctl_archive_app")
        add_jobs(conn, 2, status="done", attempts=1, finished_at=ago("1 day"))
        jobs = insert_jobs(conn, [{"argv": ["true"]}] * 3)
        worker = start_json_worker(app_dsn, "--burst", "--archive-after", "1h")
        assert worker.wait(60) == 0
        (refused,) = [e for e in worker.events("error") if "history" in e["message"]]
        assert "--no-archive" in refused["message"]
        assert conn.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'done'", (jobs,)
        ).fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM jobs_history").fetchone() == (0,)


def test_jobs_moving_while_workers_finish_and_requeues_bring_them_back_run_once(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any, tmp_path: Any
) -> None:
    # A third of the jobs fail their first try for good (max_attempts 1); a
    # requeue, as often as it can, brings them back from wherever they are,
    # while a mover on a connection of its own moves every finished job at
    # once. Each job's work must happen exactly once, and every job end in
    # exactly one of the two tables.
    ran = tmp_path / "ran"
    script = (
        'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ] && [ $(($PGQCTL_JOB_ID % 3)) = 0 ]; then exit 1; fi; '
        'echo "$PGQCTL_JOB_ID" >> "$1"'
    )
    jobs = insert_jobs(conn, [sh(script, str(ran))] * 600, max_attempts=1)
    workers = [start_json_worker(dsn, "--concurrency", "4", "--poll", "1s") for _ in range(3)]
    mover = db.connect(dsn, schema="public")
    moved = 0
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            moved += history.move(mover, 0.0, batch_size=50, budget=0.05).jobs
            assert run_cli("requeue", "--failed", "--dsn", dsn).exit_code == 0
            (done,) = conn.execute("SELECT count(*) FROM all_jobs WHERE status = 'done'").fetchone()
            if done == len(jobs):
                break
            time.sleep(0.05)
        moved += history.move(mover, 0.0).jobs
    finally:
        mover.close()
    for worker in workers:
        assert worker.stop() == 0
    assert moved > len(jobs) // 2
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    in_history = conn.execute("SELECT id, status FROM jobs_history ORDER BY id").fetchall()
    assert in_history == [(i, "done") for i in jobs]
    # Retried ones ran twice, their work once; none ran its work twice.
    lines = [int(x) for x in ran.read_text().split()]
    assert sorted(lines) == jobs
    attempts = dict(conn.execute("SELECT id, attempts FROM all_jobs").fetchall())
    assert {i for i in jobs if attempts[i] == 2} == {i for i in jobs if i % 3 == 0}


@pytest.mark.parametrize("plan", PLANS)
def test_a_move_batch_reads_its_jobs_not_the_table(
    dsn: str, conn: psycopg.Connection[Any], plan: str
) -> None:
    # The worker's plans are generic: a batch must still walk the oldest
    # finished jobs on the index, whatever jobs holds, not scan and sort
    # the table (as it did at 10 million rows, 8 s a batch).
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
        "SELECT 'k', '{}', 'done', 1, now() - interval '1 day' - i * interval '1 s' "
        "FROM generate_series(1, 50000) AS i"
    )
    conn.execute("VACUUM ANALYZE jobs")
    day = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date - 2").fetchone()[0]
    cutoff = conn.execute("SELECT now()").fetchone()[0]
    with db.connect(dsn, schema="public") as c:
        history.keep_ahead(c, day)
        params = {"status": "done", "cutoff": cutoff, "floor": history.FLOOR, "batch_size": 100}
        explained = plan_of(c, query("history_move_batch"), params, plan)
    assert rows_read(explained, "jobs") <= 1_000, explained


def test_a_move_goes_on_where_the_last_stopped_and_a_fresh_one_takes_what_it_passed(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 30, status="done", attempts=1, finished_at=ago("2 hours"))
    with db.connect(dsn, schema="public") as own:
        first = history.move(own, 0.0, batch_size=10, budget=0.0)  # one batch
        assert (first.jobs, first.more) == (10, True)
        # Plain SQL says a job finished before where that move stopped.
        (early,) = add_jobs(conn, status="done", attempts=1, finished_at=ago("1 day"))
        rest = history.move(own, 0.0, batch_size=10, budget=60.0, resume=first.resume)
        assert (rest.jobs, rest.more) == (20, False)
        assert conn.execute("SELECT id FROM jobs").fetchall() == [(early,)]
        # A move from the start, as a worker makes once no backlog is left.
        assert history.move(own, 0.0, budget=60.0).jobs == 1
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
