"""A dead worker's jobs come back in seconds, not a lease: real workers, a
real `kill -9` and SIGSTOP, and `pgqctl reap --worker` on rows of workers."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, ago, insert_jobs, job, sh
from tests.support.processes import start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

STARTED = re.compile(r" job \d+ started")
# Heartbeats every half second, dead after ten of them (5 s): short for the
# test, and ten times the interval, so a loaded machine's slow beat is not death.
BEAT = ("--heartbeat", "0.5s", "--lease", "5m")
DEAD_AFTER = {"PGQCTL_DEAD_AFTER": "10"}


def listed(dsn: str) -> dict[str, dict[str, Any]]:
    result = run_cli("workers", "--json", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    return {w["id"]: w for w in json.loads(result.stdout)}


def test_a_killed_workers_jobs_run_again_within_a_minute_not_after_the_lease(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # The first attempt hangs; the next one, on the other worker, finishes.
    script = 'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then exec sleep 600; fi'
    ids = insert_jobs(conn, [sh(script)] * 4)
    doomed = start_worker(dsn, "--concurrency", "4", "--no-reap", *BEAT)
    wait_until(lambda: len(STARTED.findall(doomed.log)) == 4, 15, "the 4 jobs to start")
    rescuer = start_worker(
        dsn,
        "--concurrency",
        "4",
        "--reap-every",
        "0.5s",
        *BEAT,
        env={**os.environ, **DEAD_AFTER},
    )
    rescuer.wait_for_log(" started: ")
    doomed_id = f"{rescuer_id(rescuer).rpartition(':')[0]}:{doomed.proc.pid}"

    doomed.proc.kill()  # SIGKILL: no hand-back; its guard stops its jobs
    doomed.proc.wait()
    killed = time.monotonic()
    wait_until(
        lambda: {job(conn, i)["status"] for i in ids} == {"done"}, 60, "the jobs to run again"
    )
    took = time.monotonic() - killed
    print(f"jobs of the killed worker done again {took:.1f}s after kill -9 (lease 300s)")
    assert "dead after 10 heartbeats" in rescuer.log  # PGQCTL_DEAD_AFTER
    rows = [job(conn, i) for i in ids]
    assert [r["attempts"] for r in rows] == [2, 2, 2, 2]
    for r in rows:  # taken for the worker's death, not for the lease's end
        assert r["last_error"].startswith(f"worker {doomed_id} dead: no heartbeat for ")
        assert re.search(rf"\(it beats every 0.5s\) \(held by {doomed_id}:\d\)$", r["last_error"])
    [line] = [x for x in rescuer.log.splitlines() if " reaped " in x]
    assert f"reaped 4 job(s) (4 of dead worker(s) {doomed_id})" in line
    dead = listed(dsn)[doomed_id]
    assert (dead["state"], dead["reaped_jobs"], dead["jobs"]) == ("dead", 4, [])
    summary = run_cli("workers", "--dsn", dsn)
    assert summary.stderr.strip() == "pgqctl: 1 worker active, 1 dead"
    rescuer.signal(signal.SIGTERM)
    assert rescuer.finish() == 0


def test_with_the_defaults_a_killed_workers_jobs_run_again_within_a_minute(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # Default heartbeat (5s), --dead-after (6) and --reap-every (30s): the
    # rescuer's next heartbeat finds the dead worker and reaps at once.
    script = 'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then exec sleep 600; fi'
    ids = insert_jobs(conn, [sh(script)] * 4)
    doomed = start_worker(dsn, "--concurrency", "4", "--no-reap", "--lease", "5m")
    wait_until(lambda: len(STARTED.findall(doomed.log)) == 4, 15, "the 4 jobs to start")
    rescuer = start_worker(dsn, "--concurrency", "4", "--lease", "5m")
    rescuer.wait_for_log(" started: ")
    assert (
        "heartbeat 5s" in rescuer.log and "reap every 30s (dead after 6 heartbeats)" in rescuer.log
    )
    doomed.proc.kill()
    doomed.proc.wait()
    killed = time.monotonic()
    wait_until(
        lambda: {job(conn, i)["status"] for i in ids} == {"done"}, 60, "the jobs to run again"
    )
    took = time.monotonic() - killed
    print(f"with the defaults, the killed worker's jobs were done again {took:.1f}s after kill -9")
    assert [job(conn, i)["attempts"] for i in ids] == [2, 2, 2, 2]
    assert all(" dead: no heartbeat for " in job(conn, i)["last_error"] for i in ids)
    rescuer.signal(signal.SIGTERM)
    assert rescuer.finish() == 0


def rescuer_id(worker: Any) -> str:
    match = re.search(r"worker (\S+:\d+) started", worker.log)
    assert match, worker.log
    return match.group(1)


def test_a_worker_only_slow_to_heartbeat_keeps_its_jobs(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    ids = insert_jobs(conn, [sh("sleep 4")] * 2)
    slow = start_worker(dsn, "--concurrency", "2", "--no-reap", *BEAT)
    wait_until(lambda: len(STARTED.findall(slow.log)) == 2, 15, "the jobs to start")
    reaper = start_worker(
        dsn, "--queue", "elsewhere", "--reap-every", "0.5s", *BEAT, env={**os.environ, **DEAD_AFTER}
    )
    reaper.wait_for_log("dead after 10 heartbeats")
    slow_id = f"{rescuer_id(reaper).rpartition(':')[0]}:{slow.proc.pid}"
    # Stopped for 2.5 s, shorter than the rule (10 beats of 0.5 s): stale, not dead.
    slow.signal(signal.SIGSTOP)
    try:
        wait_until(lambda: listed(dsn)[slow_id]["state"] == "stale", 10, "the stopped one stale")
        time.sleep(1.0)
    finally:
        slow.signal(signal.SIGCONT)
    wait_until(lambda: {job(conn, i)["status"] for i in ids} == {"done"}, 30, "the jobs to end")
    assert [job(conn, i)["attempts"] for i in ids] == [1, 1]
    assert [job(conn, i)["last_error"] for i in ids] == [None, None]
    assert " reaped " not in reaper.log
    assert listed(dsn)[slow_id]["state"] == "active"
    for w in (slow, reaper):
        w.signal(signal.SIGTERM)
        assert w.finish() == 0


def test_a_worker_back_after_its_jobs_were_taken_stops_them_and_its_reports_are_dropped(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # Attempt 1 hangs; attempt 2 (the rescuer's) finishes at once.
    script = 'if [ "$PGQCTL_JOB_ATTEMPT" = 1 ]; then exec sleep 600; fi'
    ids = insert_jobs(conn, [sh(script)] * 2)
    stalled = start_worker(dsn, "--concurrency", "2", "--no-reap", *BEAT)
    wait_until(lambda: len(STARTED.findall(stalled.log)) == 2, 15, "the jobs to start")
    rescuer = start_worker(
        dsn, "--concurrency", "2", "--reap-every", "0.5s", *BEAT, env={**os.environ, **DEAD_AFTER}
    )
    rescuer.wait_for_log(" started: ")
    stalled.signal(signal.SIGSTOP)  # longer than the rule: taken for dead
    try:
        wait_until(
            lambda: {job(conn, i)["status"] for i in ids} == {"done"}, 30, "the jobs run again"
        )
    finally:
        stalled.signal(signal.SIGCONT)
    resumed = time.monotonic()
    # Back, it learns at once that the leases are gone and stops attempt 1,
    # without waiting for its next renewal (a third of the 5 min lease).
    wait_until(lambda: stalled.log.count(" lease lost: ") == 2, 10, "both leases found lost")
    print(
        f"the stalled worker stopped its old attempts {time.monotonic() - resumed:.1f}s "
        "after SIGCONT"
    )
    stalled.signal(signal.SIGTERM)
    assert stalled.finish() == 0
    assert [(job(conn, i)["status"], job(conn, i)["attempts"]) for i in ids] == [
        ("done", 2),
        ("done", 2),
    ]
    rescuer.signal(signal.SIGTERM)
    assert rescuer.finish() == 0


# --- reap, and reap --worker, on rows of workers ----------------------------------------


def register(
    conn: psycopg.Connection[Any], worker_id: str, seen: str, heartbeat: float = 10
) -> None:
    """A row of workers, as a worker beating every `heartbeat` seconds leaves
    it, last seen `seen` ago."""
    host, _, pid = worker_id.rpartition(":")
    conn.execute(
        "INSERT INTO workers (id, host, pid, version, concurrency, heartbeat_seconds, "
        "lease_seconds, last_seen) VALUES (%s, %s, %s, 'test', 2, %s, 300, now() - %s::interval)",
        (worker_id, host, int(pid), heartbeat, seen),
    )


def server_up_for(conn: psycopg.Connection[Any], seconds: float) -> None:
    """Wait until the server has been up `seconds`: silence before its start
    does not count toward a worker's death (a suite's own server may be new)."""
    deadline = time.monotonic() + seconds + 30
    while conn.execute(
        "SELECT now() - pg_postmaster_start_time() < %s * interval '1 second'", (seconds,)
    ).fetchone() != (False,):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def held(conn: psycopg.Connection[Any], holder: str, n: int = 1) -> list[int]:
    """Running jobs held by `holder` (host:pid:slot) under a lease of five more minutes."""
    return add_jobs(
        conn,
        n,
        status="running",
        attempts=1,
        locked_until=ago("-5 minutes"),
        locked_by=holder,
    )


def test_reap_takes_the_jobs_of_a_dead_worker_and_leaves_a_stale_ones(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    server_up_for(conn, 36)
    register(conn, "dead:1", "35 seconds", heartbeat=5)  # 7 beats of 5 s: dead by the default 6
    register(conn, "slow:2", "17 seconds", heartbeat=5)  # 3.4 beats: stale, not dead
    register(conn, "a_b:3", "1 second", heartbeat=5)
    gone = held(conn, "dead:1:0") + held(conn, "dead:1:prefetch")
    kept = held(conn, "slow:2:0") + held(conn, "a_b:3:0") + held(conn, "axb:3:0")

    preview = run_cli("reap", "--dry-run", "--json", "--dsn", dsn)
    assert preview.exit_code == 0, preview.stderr
    assert [(j["id"], j["status"], j["reason"]) for j in json.loads(preview.stdout)] == [
        (i, "pending", "dead") for i in gone
    ]
    result = run_cli("reap", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    assert result.stderr.strip() == (
        "pgqctl: reaped 2 jobs (2 of dead worker dead:1): 2 back to pending, "
        "0 failed (out of attempts)"
    )
    assert [(job(conn, i)["status"], job(conn, i)["attempts"]) for i in gone] == [
        ("pending", 1),
        ("pending", 1),
    ]
    assert {job(conn, i)["status"] for i in kept} == {"running"}
    # Its late report (the attempt it claimed) matches nothing: the fence.
    late = conn.execute(
        "UPDATE jobs SET status = 'done' WHERE id = %s AND attempts = 1 AND status = 'running'",
        (gone[0],),
    )
    assert late.rowcount == 0
    states = {w: (r["state"], r["reaped_jobs"]) for w, r in listed(dsn).items()}
    assert states == {"a_b:3": ("active", 0), "dead:1": ("dead", 2), "slow:2": ("stale", 0)}

    # A longer rule leaves the stale one; a heartbeat brings the dead one back.
    assert run_cli("reap", "--dead-after", "5", "--dsn", dsn).stderr.strip() == (
        "pgqctl: no expired leases"
    )
    conn.execute("UPDATE workers SET last_seen = now() WHERE id = 'dead:1'")
    assert listed(dsn)["dead:1"]["state"] == "active"


def test_time_the_server_was_down_does_not_count_toward_death(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # Last seen a day before the server started, with a rule (6 beats) a
    # minute longer than the server has been up: silent for a day, yet the
    # server has not been up long enough for it to have come back.
    [(up,)] = conn.execute(
        "SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8"
    ).fetchall()
    conn.execute(
        "INSERT INTO workers (id, host, pid, version, concurrency, heartbeat_seconds, "
        "lease_seconds, last_seen) VALUES ('back:1', 'back', 1, 'test', 1, %s, 300, "
        "pg_postmaster_start_time() - interval '1 day')",
        ((up + 60) / 6,),
    )
    kept = held(conn, "back:1:0")
    assert run_cli("reap", "--dsn", dsn).stderr.strip() == "pgqctl: no expired leases"
    assert job(conn, kept[0])["status"] == "running"


@pytest.mark.parametrize("value", ["2", "0", "x"])
def test_a_dead_after_below_the_stale_mark_exits_2(module_dsn: str, value: str) -> None:
    for args in (("reap",), ("worker", "--burst")):
        result = run_cli(*args, "--dead-after", value, "--dsn", module_dsn)
        assert result.exit_code == 2, result.stderr
        assert "Invalid value for '--dead-after'" in result.stderr


def test_reap_worker_takes_a_stale_workers_jobs_now_and_refuses_an_active_one(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    register(conn, "live:1", "5 seconds")
    register(conn, "quiet:2", "35 seconds")  # stale: 3.5 beats of 10 s
    alive = held(conn, "live:1:0")
    quiet = held(conn, "quiet:2:0", 2)
    other = held(conn, "live:1:1", 1)  # an expired lease of another worker: left
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 minute' WHERE id = %s", other)

    refused = run_cli("reap", "--worker", "live:1", "--dsn", dsn)
    assert refused.exit_code == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith("pgqctl: error: worker live:1 is active (last heartbeat ")
    unknown = run_cli("reap", "--worker", "nobody:9", "--dsn", dsn)
    assert unknown.exit_code == 2
    assert "no worker 'nobody:9' in the registry" in unknown.stderr
    assert {job(conn, i)["status"] for i in alive + quiet + other} == {"running"}

    dry = run_cli("reap", "--worker", "quiet:2", "--dry-run", "--json", "--dsn", dsn)
    assert [(j["id"], j["reason"]) for j in json.loads(dry.stdout)] == [(i, "asked") for i in quiet]
    assert {job(conn, i)["status"] for i in quiet} == {"running"}
    taken = run_cli("reap", "--worker", "quiet:2", "--json", "--dsn", dsn)
    assert taken.exit_code == 0, taken.stderr
    assert [j["id"] for j in json.loads(taken.stdout)] == quiet
    assert [job(conn, i)["status"] for i in quiet] == ["pending", "pending"]
    assert job(conn, quiet[0])["last_error"].startswith(
        "worker quiet:2 reaped on demand: no heartbeat for "
    )
    assert {job(conn, i)["status"] for i in alive + other} == {"running"}
    assert listed(dsn)["quiet:2"]["state"] == "dead"
