"""`worker --prefetch N`: real worker processes claim jobs ahead of their free
slots, start them in claim order, renew their leases, hand them back on
SIGTERM, lose them to reap after `kill -9`, and drop them when cancelled;
`leases` and `workers` show them as prefetched."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job, sh
from tests.support.processes import start_json_worker, wait_for_listener, wait_until

__all__ = ["start_json_worker"]  # a fixture

HOST = socket.gethostname()
# The worker's own clock work (reap, heartbeats) kept out of the way, unless a test wants it.
QUIET = ("--reap-every", "1h", "--heartbeat", "0.5s")


def sleeps(seconds: float) -> dict[str, list[str]]:
    return {"argv": ["sleep", str(seconds)]}


def holders(conn: psycopg.Connection[Any]) -> dict[int, str]:
    """locked_by of each running job."""
    rows = conn.execute("SELECT id, locked_by FROM jobs WHERE status = 'running'").fetchall()
    return dict(rows)


def listed_worker(dsn: str, pid: int) -> dict[str, Any] | None:
    result = run_cli("workers", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return {w["id"]: w for w in json.loads(result.stdout)}.get(f"{HOST}:{pid}")


def wait_for_one_running_two_prefetched(dsn: str, pid: int, ids: list[int]) -> None:
    def holding() -> bool:
        found = listed_worker(dsn, pid)
        return found is not None and (found["jobs"], found["prefetched"]) == (ids[:1], ids[1:3])

    wait_until(holding, 15, "1 running and 2 prefetched jobs in `workers`")


def test_one_running_and_two_prefetched_shown_by_leases_and_workers(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    ids = insert_jobs(conn, [sleeps(60)] * 5)
    worker = start_json_worker(
        dsn, "--concurrency", "1", "--prefetch", "2", "--grace", "0s", *QUIET
    )
    wait_for_one_running_two_prefetched(dsn, worker.proc.pid, ids)
    me = f"{HOST}:{worker.proc.pid}"
    assert holders(conn) == {ids[0]: f"{me}:0", ids[1]: f"{me}:prefetch", ids[2]: f"{me}:prefetch"}
    assert [job(conn, i)["status"] for i in ids[3:]] == ["pending", "pending"]
    assert len(worker.events("started")) == 1  # the prefetched ones wait

    leases = run_cli("leases", "--format", "plain", "--dsn", dsn)
    assert leases.exit_code == 0, leases.stderr
    by_id = {int(line.split()[0]): line.split()[4] for line in leases.stdout.splitlines()[2:]}
    assert by_id == holders(conn)

    table = run_cli("workers", "--format", "plain", "--dsn", dsn)
    assert table.exit_code == 0, table.stderr
    header, _, row = table.stdout.splitlines()
    assert header.split()[-2:] == ["jobs", "prefetched"]
    assert ids[2] == ids[1] + 1  # ids that follow each other are shown as a range
    assert re.split(r"\s{2,}", row)[-2:] == [str(ids[0]), f"{ids[1]}-{ids[2]}"]
    assert worker.stop() == 0


def test_prefetched_jobs_start_in_claim_order_and_take_the_freed_slot(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    ids = insert_jobs(conn, [sleeps(0.3)] * 6)
    # Claim order is priority first: the reverse of the ids here.
    conn.execute("UPDATE jobs SET priority = id")
    claim_order = [
        row[0] for row in conn.execute("SELECT id FROM jobs ORDER BY priority DESC, run_at, id")
    ]
    assert claim_order != ids
    worker = start_json_worker(dsn, "--concurrency", "1", "--prefetch", "2", "--burst", *QUIET)
    assert worker.proc.wait(30) == 0
    assert [e["job_id"] for e in worker.events("started")] == claim_order
    # Each prefetched job moved from :prefetch to the slot it ran in.
    me = f"{HOST}:{worker.proc.pid}"
    rows = conn.execute("SELECT status, locked_by, attempts FROM jobs").fetchall()
    assert set(rows) == {("done", f"{me}:0", 1)}


def test_sigterm_hands_prefetched_jobs_back_at_once_while_the_running_one_finishes(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    ids = insert_jobs(conn, [sleeps(3)] * 4)
    worker = start_json_worker(
        dsn, "--concurrency", "1", "--prefetch", "2", "--grace", "30s", *QUIET
    )
    wait_for_one_running_two_prefetched(dsn, worker.proc.pid, ids)
    worker.proc.send_signal(signal.SIGTERM)
    for i in ids[1:3]:
        worker.wait_for("handed_back", 2, job_id=i, prefetched=True)
    # At once: the running job is still running.
    assert job(conn, ids[0])["status"] == "running"
    for i in ids[1:3]:
        row = job(conn, i)
        assert (row["status"], row["attempts"], row["handbacks"], row["locked_until"]) == (
            "pending",
            1,
            1,
            None,
        )
        assert row["attempts"] - row["handbacks"] == 0  # no try used
    assert worker.proc.wait(15) == 0
    assert job(conn, ids[0])["status"] == "done"
    assert worker.events("handed_back")[0]["prefetched"] is True
    assert len(worker.events("handed_back")) == 2
    assert [e["job_id"] for e in worker.events("started")] == ids[:1]
    assert job(conn, ids[3])["status"] == "pending"


def test_after_kill_9_reap_returns_the_prefetched_jobs(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    ids = insert_jobs(conn, [sleeps(60)] * 3)
    worker = start_json_worker(
        dsn, "--concurrency", "1", "--prefetch", "2", "--lease", "1s", *QUIET
    )
    wait_for_one_running_two_prefetched(dsn, worker.proc.pid, ids)
    worker.proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    time.sleep(1.2)  # the lease runs out
    reaped = run_cli("reap", "--json", "--dsn", dsn)
    assert reaped.exit_code == 0, reaped.stderr
    assert sorted(j["id"] for j in json.loads(reaped.stdout)) == ids
    for i in ids:
        assert (job(conn, i)["status"], job(conn, i)["attempts"]) == ("pending", 1)


def test_a_cancelled_prefetched_job_never_starts(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    first, ahead = insert_jobs(conn, [sleeps(2), sh('echo "$PGQCTL_JOB_ID" >> "$1"', str(ran))])
    worker = start_json_worker(dsn, "--concurrency", "1", "--prefetch", "1", "--burst", *QUIET)
    wait_for_listener(conn)
    wait_until(lambda: len(holders(conn)) == 2, 10, "one running job and one prefetched")
    assert holders(conn)[ahead].endswith(":prefetch")
    cancelled = run_cli("cancel", "--dsn", dsn, "--id", str(ahead))
    assert cancelled.exit_code == 0, cancelled.stderr
    event = worker.wait_for("cancelled", 5, job_id=ahead)
    assert (event["prefetched"], event["noticed"]) == (True, "notification")
    assert job(conn, first)["status"] == "running"  # not disturbed
    later = insert_jobs(conn, [sh('echo "$PGQCTL_JOB_ID" >> "$1"', str(ran))])
    assert worker.proc.wait(20) == 0
    assert [e["job_id"] for e in worker.events("started")] == [first, *later]
    assert ran.read_text().split() == [str(i) for i in later]
    assert job(conn, ahead)["status"] == "cancelled"
    assert job(conn, first)["status"] == "done"


def test_a_job_prefetched_before_its_queue_was_paused_still_runs(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    first, ahead, later = insert_jobs(conn, [sleeps(1.5), sleeps(0.1), sleeps(0.1)])
    worker = start_json_worker(dsn, "--concurrency", "1", "--prefetch", "1", "--burst", *QUIET)
    wait_until(lambda: len(holders(conn)) == 2, 10, "one running job and one prefetched")
    assert run_cli("pause", "default", "--dsn", dsn).exit_code == 0
    assert worker.proc.wait(20) == 0
    # The docs' promise: claimed before the pause, it runs; the claims that follow stop.
    assert [e["job_id"] for e in worker.events("started")] == [first, ahead]
    assert [job(conn, i)["status"] for i in (first, ahead, later)] == ["done", "done", "pending"]


def test_renewal_keeps_prefetched_leases_past_the_lease(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    ids = insert_jobs(conn, [sleeps(3.5), sleeps(0.1)])
    worker = start_json_worker(
        dsn, "--concurrency", "1", "--prefetch", "1", "--lease", "1s", *QUIET
    )
    wait_until(lambda: len(holders(conn)) == 2, 10, "one running job and one prefetched")
    claimed = time.monotonic()
    checks = 0
    while time.monotonic() - claimed < 2.5:  # past two leases, the first job still running
        time.sleep(0.3)
        alive = conn.execute(
            "SELECT locked_until > now(), locked_by FROM jobs WHERE id = %s", (ids[1],)
        ).fetchone()
        assert alive is not None and alive[0] and alive[1].endswith(":prefetch")
        # Nothing to take: every lease is live.
        reaped = run_cli("reap", "--json", "--dsn", dsn)
        assert reaped.exit_code == 0 and json.loads(reaped.stdout or "[]") == []
        checks += 1
    assert checks >= 5
    wait_until(lambda: job(conn, ids[1])["status"] == "done", 10, "the prefetched job to run")
    assert job(conn, ids[1])["attempts"] == 1
    assert worker.events("lease_lost") == []
    assert worker.stop() == 0


def test_bad_prefetch_values_exit_2(dsn: str) -> None:
    for value in ("-1", "abc", "1.5", "100000"):
        result = run_cli("worker", "--dsn", dsn, "--prefetch", value)
        assert result.exit_code == 2, (value, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "--prefetch" in result.stderr
    env = {**os.environ, "PGQCTL_PREFETCH": "abc"}
    result = run_cli("worker", "--dsn", dsn, env=env)
    assert result.exit_code == 2
    assert "PGQCTL_PREFETCH" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_more_free_slots_than_one_claim_takes_are_filled_at_once(
    dsn: str, conn: psycopg.Connection[Any], start_json_worker: Any
) -> None:
    # One slot and 1,500 ahead: more than one claim takes (claims.MOST_PER_CLAIM,
    # 100). The jobs fall due 3 s after the worker starts, well after its
    # first look (nothing due then) and its listener's: the claim at their
    # due time is the first to find any. No job ends and the poll is a minute
    # away, so the jobs past that claim are held within seconds only if a
    # whole claim asks for the next one at once.
    ids = insert_jobs(conn, [sleeps(120)] * 1_600)
    conn.execute("UPDATE jobs SET run_at = now() + interval '3 seconds'")
    worker = start_json_worker(
        dsn, "--concurrency", "1", "--prefetch", "1500", "--poll", "60s", "--grace", "0s", *QUIET
    )

    def held() -> int:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE status = 'running' AND locked_by LIKE %s",
            (f"{HOST}:{worker.proc.pid}%",),
        ).fetchone()
        return int(row[0]) if row else 0

    wait_until(lambda: held() == 1_501, 20, "the worker to hold 1 running and 1,500 prefetched")
    time.sleep(0.5)
    assert held() == 1_501  # no more than its slots and prefetch
    pending = conn.execute("SELECT min(id) FROM jobs WHERE status = 'pending'").fetchone()
    assert pending == (ids[1_501],)  # claimed in order
