"""A running job cancelled: stopped by the worker that holds it in another
process, fenced against the job's own end.

Workers are real `pgqctl worker` processes running real children; cancels
are the CLI, or the library on concurrent connections of their own.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from pgqctl import admin, claims, db
from pgqctl.worker import TERM_GRACE
from tests.conftest import alive, gone
from tests.integration.commands.test_cancel import assert_cancelled, cancel_json
from tests.support.jobrows import expired, insert_jobs, job
from tests.support.processes import start_json_worker, wait_for_listener, wait_until
from tests.support.servers import Pooler, txn_pooler

__all__ = ["start_json_worker", "txn_pooler"]  # fixtures


def family_job(pids: Path) -> dict[str, str]:
    """A shell job whose child starts a grandchild, each writing its pid to
    `pids` (the shell itself, its child shell, and that one's sleep)."""
    inner = f"echo $$ >> {pids}; sleep 300 & echo $! >> {pids}; wait"
    return {"shell": f"echo $$ >> {pids}; sh -c '{inner}' & wait"}


def wait_for_family(pids: Path) -> list[int]:
    wait_until(
        lambda: pids.exists() and len(pids.read_text().split()) == 3, 10, "the job's 3 processes"
    )
    found = [int(p) for p in pids.read_text().split()]
    assert all(alive(p) for p in found)
    return found


# -- a running job, stopped by its worker -------------------------------------


def test_cancel_stops_a_running_job_in_another_process_at_once(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_json_worker: Any
) -> None:
    pids = tmp_path / "pids"
    # A long lease: the worker's renewal (a third of it) cannot be what stops it.
    worker = start_json_worker(dsn, "--allow-shell", "--lease", "60s", "--concurrency", "2")
    wait_for_listener(conn)
    (job_id,) = insert_jobs(conn, [family_job(pids)])
    family = wait_for_family(pids)

    jobs, said = cancel_json(dsn, "--id", str(job_id), "--reason", "wrong customer")
    assert [(j["id"], j["status"], j["cancelled_from"], j["lease_expired"]) for j in jobs] == [
        (job_id, "cancelled", "running", False)
    ]
    assert jobs[0]["attempts"] == 1
    assert "1 running (their workers are told to stop them)" in said

    # SIGTERM ends them all at once; SIGKILL would come TERM_GRACE later.
    assert all(gone(p, within=TERM_GRACE) for p in family), "a process of the job survived"
    event = worker.wait_for("cancelled", job_id=job_id)
    assert event["noticed"] == "notification"
    assert event["reason"] == "cancelled: wrong customer"
    assert_cancelled(conn, job_id, attempts=1, error="cancelled: wrong customer")

    # The worker goes on working, and never runs the cancelled job again.
    (other,) = insert_jobs(conn, [{"argv": ["true"]}])
    worker.wait_for("done", job_id=other)
    assert_cancelled(conn, job_id, attempts=1, error="cancelled: wrong customer")
    assert [e["job_id"] for e in worker.events("started")] == [job_id, other]
    assert not [e for e in worker.events() if e["event"] in ("lease_lost", "failed", "retry")]
    assert worker.stop() == 0


def test_a_notification_alone_stops_nothing(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_json_worker: Any
) -> None:
    # Any role that can connect may send a notification; only a job the
    # database says is cancelled is stopped.
    worker = start_json_worker(dsn, "--allow-shell", "--lease", "60s")
    wait_for_listener(conn)
    pids = tmp_path / "pids"
    (job_id,) = insert_jobs(conn, [family_job(pids)])
    family = wait_for_family(pids)
    conn.execute(
        "SELECT pg_notify('pgqctl_cancel', %s)",
        (json.dumps({"schema": "public", "jobs": [[job_id, 1]]}),),
    )
    # The worker checks the row it was told about: one query, well within this.
    assert not gone(family[-1], within=2)
    assert job(conn, job_id)["status"] == "running"
    assert not worker.events("cancelled")

    cancel_json(dsn, "--id", str(job_id))
    assert all(gone(p, within=TERM_GRACE) for p in family)
    assert worker.wait_for("cancelled", job_id=job_id)["noticed"] == "notification"
    assert worker.stop() == 0


def test_a_worker_that_cannot_hear_finds_the_cancel_at_its_lease_renewal(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path, start_json_worker: Any
) -> None:
    # Its listen connection cannot be made (nothing serves that port): the
    # worker polls, and hears no notification, as behind a transaction pooler.
    listen_dsn = "postgresql://postgres@127.0.0.1:1/postgres?connect_timeout=2"
    lease = 3.0
    worker = start_json_worker(
        dsn, "--allow-shell", "--lease", f"{lease}s", "--listen-dsn", listen_dsn
    )
    pids = tmp_path / "pids"
    (job_id,) = insert_jobs(conn, [family_job(pids)])
    family = wait_for_family(pids)

    jobs, _ = cancel_json(dsn, "--id", str(job_id))
    assert [j["status"] for j in jobs] == ["cancelled"]
    # Within a third of the lease (the renewal), then SIGTERM.
    assert all(gone(p, within=lease / 3 + TERM_GRACE) for p in family)
    event = worker.wait_for("cancelled", job_id=job_id)
    assert event["noticed"] == "renewal"
    assert_cancelled(conn, job_id, attempts=1, error="cancelled by an operator")
    assert not worker.events("lease_lost")
    assert worker.stop() == 0


def test_a_worker_behind_a_transaction_pooler_stops_a_cancelled_job_at_renewal(
    conn: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    start_json_worker: Any,
    txn_pooler: Pooler,
) -> None:
    # Through PgBouncer in transaction mode a LISTEN cannot be heard: the
    # worker says so and relies on its renewal.
    lease = 3.0
    worker = start_json_worker(txn_pooler.dsn(dsn), "--allow-shell", "--lease", f"{lease}s")
    worker.wait_for("listen_unavailable")
    pids = tmp_path / "pids"
    (job_id,) = insert_jobs(conn, [family_job(pids)])
    family = wait_for_family(pids)

    cancel_json(txn_pooler.dsn(dsn), "--id", str(job_id), "--reason", "pooled")
    assert all(gone(p, within=lease / 3 + TERM_GRACE) for p in family)
    assert worker.wait_for("cancelled", job_id=job_id)["noticed"] == "renewal"
    assert_cancelled(conn, job_id, attempts=1, error="cancelled: pooled")
    assert not worker.events("lease_lost")
    assert worker.stop() == 0


# -- cancel racing the job's own end -------------------------------------------


def test_cancel_racing_completion_ends_each_job_one_way(
    conn: psycopg.Connection[Any], dsn: str, start_json_worker: Any
) -> None:
    n = 200
    ids = insert_jobs(conn, [{"argv": ["sleep", "0.2"]}] * n)
    workers = [start_json_worker(dsn, "--concurrency", "4", "--burst") for _ in range(3)]
    # Four cancellers on connections of their own, from the first claim until
    # every job has ended, each cancelling a few jobs at a time: some of those
    # running now (each may be ending at this instant), some at random (the
    # same job may be cancelled by two at once).
    reported: list[tuple[int, str]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    wait_until(
        lambda: conn.execute("SELECT 1 FROM jobs WHERE status <> 'pending'").fetchone(),
        30,
        "a first claim",
    )

    def canceller(seed: int) -> None:
        chooser = random.Random(seed)
        try:
            with db.connect(dsn, schema="public") as c:
                while True:
                    with c.transaction():
                        live = [
                            r[0]
                            for r in c.execute(
                                "SELECT id, status FROM jobs "
                                "WHERE status IN ('pending', 'running') ORDER BY status DESC"
                            ).fetchall()
                        ]
                    if not live:
                        return
                    # Running ones sort first (status DESC).
                    chosen = {*live[: chooser.randint(0, 2)], chooser.choice(ids)}
                    result = admin.cancel(
                        c, admin.CancelSelection(ids=tuple(chosen)), reason="race"
                    )
                    with lock:
                        reported.extend((j.job.id, j.cancelled_from) for j in result.jobs)
                    time.sleep(chooser.uniform(0.02, 0.08))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=canceller, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert [w.proc.wait(60) for w in workers] == [0, 0, 0]

    rows = conn.execute(
        "SELECT id, status, attempts, last_error, finished_at IS NOT NULL, locked_until "
        "FROM jobs ORDER BY id"
    ).fetchall()
    assert [r[0] for r in rows] == ids
    cancelled = {r[0] for r in rows if r[1] == "cancelled"}
    done = {r[0] for r in rows if r[1] == "done"}
    assert cancelled | done == set(ids), "a job ended neither done nor cancelled"
    assert cancelled and done, "the race had no contest: one side took every job"
    # Each cancel took each job at most once, and every cancel stuck.
    assert sorted(job_id for job_id, _ in reported) == sorted(cancelled)
    for job_id, status, attempts, error, finished, locked_until in rows:
        assert finished and locked_until is None
        assert attempts <= 1
        assert error == ("cancelled: race" if status == "cancelled" else None), job_id
    # The workers logged done for the done jobs only, each once: no result
    # of a cancelled job was applied.
    logged_done = [e["job_id"] for w in workers for e in w.events("done")]
    assert sorted(logged_done) == sorted(done)
    # Each running job cancelled was said to be cancelled by its worker.
    from_running = {job_id for job_id, was in reported if was == "running"}
    logged_cancelled = {e["job_id"] for w in workers for e in w.events("cancelled")}
    assert from_running, "no running job was cancelled"
    assert from_running <= logged_cancelled
    assert not [e for w in workers for e in w.events() if e["event"] == "lease_lost"]
    print(
        f"{len(done)} done, {len(cancelled)} cancelled "
        f"({len(from_running)} while running, {len(reported) - len(from_running)} pending)"
    )


def test_a_stale_workers_late_report_cannot_undo_a_cancel(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    insert_jobs(conn, [{"argv": ["true"]}] * 4)
    with db.connect(dsn, schema="public") as c:
        claimed = claims.exchange(c, claim=4, lease=60, worker="stale:1").claimed
        held = [j.held for j in claimed]
        jobs, _ = cancel_json(dsn, *(a for h in held for a in ("--id", str(h[0]))))
        assert len(jobs) == 4
        # Every report a worker can make, all fenced on status running.
        changed = claims.exchange(
            c,
            done=[held[0]],
            failed=[claims.Failure(held[1][0], held[1][1], "boom", 0.0)],
            handed_back=[held[2]],
            renew=[held[3]],
            lease=60,
            worker="stale:1",
        )
    assert (changed.done, changed.failed, changed.handed_back, changed.renewed) == (
        set(),
        {},
        set(),
        set(),
    )
    for job_id, attempt in held:
        assert_cancelled(conn, job_id, attempts=attempt, error="cancelled by an operator")


def test_the_cancel_notification_fits_many_running_jobs(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    # More running jobs than one notification's payload can name.
    n = admin.NOTIFY_CANCEL_BATCH * 2 + 1
    ids = expired(conn, n, locked_until=None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgqctl_cancel")
        jobs, _ = cancel_json(dsn, "--status", "running")
        assert len(jobs) == n
        named = []
        for note in listener.notifies(timeout=5, stop_after=3):
            payload = json.loads(note.payload)
            assert payload["schema"] == "public"
            named += [tuple(pair) for pair in payload["jobs"]]
    assert sorted(named) == [(i, 1) for i in ids]
