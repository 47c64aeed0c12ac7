"""The worker registry: real worker processes register, heartbeat, stop, and
die (`kill -9`); `pgqctl workers`, `check --min-workers` and `metrics` see it."""

from __future__ import annotations

import json
import signal
import socket
import time
from typing import Any

import psycopg

from pgqctl.worker import application_name
from tests.conftest import run_cli
from tests.integration.commands.test_metrics import samples
from tests.support.jobrows import insert_jobs
from tests.support.processes import start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

HOST = socket.gethostname()
SLEEP = {"argv": ["sleep", "60"]}


def listed(dsn: str) -> dict[str, dict[str, Any]]:
    result = run_cli("workers", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return {w["id"]: w for w in json.loads(result.stdout)}


def worker_id(worker: Any) -> str:
    return f"{HOST}:{worker.proc.pid}"


def rows(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    cur = conn.execute("SELECT * FROM workers")
    names = [d.name for d in cur.description or []]
    return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def queue_jobs(conn: psycopg.Connection[Any], queue: str, count: int) -> list[int]:
    ids = insert_jobs(conn, [SLEEP] * count)
    conn.execute("UPDATE jobs SET queue = %s WHERE id = ANY(%s)", (queue, ids))
    return ids


def test_workers_lists_running_workers_and_marks_one_killed_stale(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # The jobs are in place before the workers start, so each claims its own.
    emails = queue_jobs(conn, "emails", 2)
    reports = queue_jobs(conn, "reports", 1)
    beat = ["--heartbeat", "0.5s", "--reap-every", "1h", "--grace", "0s"]
    first = start_worker(dsn, "--queue", "emails", "--concurrency", "2", *beat)
    second = start_worker(dsn, "--queue", "reports", "--kind", "test", "--concurrency", "3", *beat)
    a, b = worker_id(first), worker_id(second)

    def holding() -> bool:
        found = listed(dsn)
        return (
            found.keys() == {a, b}
            and found[a]["jobs"] == emails
            and found[b]["jobs"] == reports
            and (found[a]["running"], found[b]["running"]) == (2, 1)
        )

    wait_until(holding, 15, "both workers listed with their running jobs")
    found = listed(dsn)
    assert {w["state"] for w in found.values()} == {"active"}
    assert (found[a]["queues"], found[a]["kinds"], found[a]["concurrency"]) == (["emails"], [], 2)
    assert (found[b]["queues"], found[b]["kinds"], found[b]["concurrency"]) == (
        ["reports"],
        ["test"],
        3,
    )
    assert (found[a]["host"], found[a]["pid"]) == (HOST, first.proc.pid)
    assert found[a]["heartbeat_seconds"] == 0.5
    # Every running job's holder is a row of workers: its id and the slot.
    holders = conn.execute("SELECT locked_by FROM jobs WHERE status = 'running'").fetchall()
    assert sorted(h.rpartition(":")[0] for (h,) in holders) == sorted([a, a, b])
    table = run_cli("workers", "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0, table.stderr
    [header, _, *lines] = table.stdout.splitlines()
    assert header.split()[:3] == ["host", "pid", "state"]
    assert [line.split()[1:3] for line in lines] == sorted(
        [[str(first.proc.pid), "active"], [str(second.proc.pid), "active"]]
    )
    assert table.stderr.strip() == "pgqctl: 2 workers active"

    second.proc.kill()  # SIGKILL: its row stays behind, no heartbeat any more
    second.proc.wait()
    killed = time.monotonic()
    wait_until(lambda: listed(dsn)[b]["state"] == "stale", 10, "the killed worker to go stale")
    assert time.monotonic() - killed >= 1.0  # three intervals of 0.5s, about
    found = listed(dsn)
    assert (found[a]["state"], found[b]["state"]) == ("active", "stale")
    assert found[b]["jobs"] == reports  # until its lease runs out and it is reaped
    stale = run_cli("workers", "--dsn", dsn)
    assert stale.stderr.strip() == "pgqctl: 1 worker active, 1 stale"

    metrics = run_cli("metrics", "--dsn", dsn)
    assert metrics.exit_code == 0, metrics.stderr
    got = samples(metrics.stdout)
    assert got[("pgqctl_workers", (("state", "active"),))] == 1
    assert got[("pgqctl_workers", (("state", "stale"),))] == 1
    assert got[("pgqctl_queue_workers", (("queue", "emails"),))] == 1
    assert got[("pgqctl_queue_workers", (("queue", "reports"),))] == 0
    first.signal(signal.SIGTERM)  # --grace 0s: its jobs are stopped at once
    assert first.finish() == 0


def test_a_clean_stop_removes_the_row(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    worker = start_worker(dsn, "--heartbeat", "0.5s")
    wait_until(lambda: worker_id(worker) in rows(conn), 10, "the worker to register")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert rows(conn) == {}
    burst = run_cli("worker", "--burst", "--dsn", dsn)
    assert burst.exit_code == 0, burst.stderr
    assert rows(conn) == {}
    empty = run_cli("workers", "--dsn", dsn)
    assert (empty.exit_code, empty.stdout) == (0, "")
    assert empty.stderr == "pgqctl: no workers registered\n"


def test_a_worker_heartbeats_when_idle_and_when_every_slot_is_busy(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # Nothing else would wake these loops for 30 s (poll) or 100 s (renewal).
    idle = start_worker(dsn, "--queue", "none", "--heartbeat", "0.3s", "--poll", "30s")
    [job_id] = queue_jobs(conn, "busy", 1)
    busy = start_worker(
        dsn, "--queue", "busy", "--concurrency", "1", "--heartbeat", "0.3s", "--grace", "0s"
    )
    for worker in (idle, busy):
        wait_until(lambda w=worker: worker_id(w) in rows(conn), 10, "the worker to register")
    wait_until(lambda: rows(conn)[worker_id(busy)]["running"] == 1, 10, "the busy worker's job")
    before = rows(conn)
    time.sleep(1.0)
    after = rows(conn)
    for worker in (idle, busy):
        key = worker_id(worker)
        assert after[key]["last_seen"] > before[key]["last_seen"]
        assert after[key]["started_at"] == before[key]["started_at"]
    assert listed(dsn)[worker_id(busy)]["jobs"] == [job_id]
    for worker in (idle, busy):
        worker.signal(signal.SIGTERM)
        assert worker.finish() == 0


def test_a_row_removed_comes_back_after_a_reconnect_with_its_start(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    worker = start_worker(dsn, "--heartbeat", "0.3s")
    key = worker_id(worker)
    wait_until(lambda: key in rows(conn), 10, "the worker to register")
    started = rows(conn)[key]["started_at"]
    conn.execute("DELETE FROM workers")
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = %s",
        (application_name(key),),
    )
    wait_until(lambda: "database connection restored" in worker.log, 15, "the reconnect")
    wait_until(lambda: key in rows(conn), 10, "the row to come back")
    assert rows(conn)[key]["started_at"] == started
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_a_row_stale_for_an_hour_is_removed_by_another_workers_reap(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    gone = start_worker(dsn, "--heartbeat", "0.3s", "--no-reap")
    wait_until(lambda: worker_id(gone) in rows(conn), 10, "the worker to register")
    gone.proc.kill()
    gone.proc.wait()
    # One gone for over an hour, one for ten minutes (stale, kept for now).
    conn.execute(
        "UPDATE workers SET last_seen = now() - interval '61 minutes' WHERE id = %s",
        (worker_id(gone),),
    )
    conn.execute(
        "INSERT INTO workers (id, host, pid, version, concurrency, heartbeat_seconds, "
        "lease_seconds, last_seen) "
        "VALUES ('elsewhere:7', 'elsewhere', 7, '0.1.0', 1, 10, 300, now() - interval '10m')"
    )
    assert listed(dsn)["elsewhere:7"]["state"] == "stale"
    reaper = start_worker(dsn, "--reap-every", "0.2s")
    wait_until(lambda: worker_id(gone) not in rows(conn), 10, "the old row to go")
    assert rows(conn).keys() == {"elsewhere:7", worker_id(reaper)}
    reaper.wait_for_log(f"removed 1 worker(s) not seen for an hour from workers: {worker_id(gone)}")
    reaper.signal(signal.SIGTERM)
    assert reaper.finish() == 0


def test_both_connections_of_a_worker_are_named_after_it(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    worker = start_worker(dsn)
    name = f"pgqctl worker {worker_id(worker)}"
    seen = (
        "SELECT application_name FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name LIKE 'pgqctl worker %'"
    )
    wait_until(lambda: len(conn.execute(seen).fetchall()) == 2, 10, "both connections")
    assert conn.execute(seen).fetchall() == [(name,), (name,)]
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_check_min_workers_counts_the_active_workers_serving_each_queue(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    beat = ["--heartbeat", "0.5s", "--poll", "30s"]
    emails = start_worker(dsn, "--queue", "emails", *beat)
    sms = start_worker(dsn, "--queue", "sms", "--queue", "other", *beat)
    wait_until(lambda: len(rows(conn)) == 2, 10, "both workers to register")

    def check() -> tuple[int, list[str]]:
        args = ["--min-workers", "2", "--queue", "emails", "--queue", "sms"]
        result = run_cli("check", "--dsn", dsn, *args)
        return result.exit_code, result.stdout.splitlines()

    assert check() == (
        3,
        [
            "CRITICAL emails: 1 active worker serving it (min 2)",
            "CRITICAL sms: 1 active worker serving it (min 2)",
        ],
    )
    every = start_worker(dsn, *beat)  # no --queue: serves every queue
    wait_until(lambda: len(rows(conn)) == 3, 10, "the third worker to register")
    assert check() == (0, [])
    figures = json.loads(run_cli("check", "--min-workers", "3", "--json", "--dsn", dsn).stdout)
    assert figures["queues"] == []  # no job anywhere: nothing to hold to it
    every.proc.kill()  # gone, but only stale once three heartbeats are missed
    every.proc.wait()
    wait_until(lambda: check()[0] == 3, 10, "the killed worker to stop counting")
    for worker in (emails, sms):
        worker.signal(signal.SIGTERM)
        assert worker.finish() == 0


def test_the_heartbeat_counts_the_attempts_done_and_failed_since_the_start(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    insert_jobs(conn, [{"argv": ["true"]}] * 3)
    insert_jobs(conn, [{"argv": ["false"]}], max_attempts=2)
    worker = start_worker(dsn, "--heartbeat", "0.3s", "--backoff", "0")
    key = worker_id(worker)
    wait_until(
        lambda: (
            key in rows(conn) and (rows(conn)[key]["done"], rows(conn)[key]["failed"]) == (3, 2)
        ),
        15,
        "the heartbeat to count 3 done and 2 failed attempts",
    )
    assert listed(dsn)[key]["running"] == 0
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_a_bad_heartbeat_exits_2(module_dsn: str) -> None:
    result = run_cli("worker", "--burst", "--heartbeat", "0s", "--dsn", module_dsn)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "pgqctl: error: --heartbeat must be more than 0s, e.g. --heartbeat 5s"
    ]
