"""Schedules ticked by real worker processes: one job per tick from a fleet
whose workers are killed with `kill -9` and restarted, and catch-up after
every worker was stopped."""

from __future__ import annotations

import datetime as dt
import json
import random
import signal
import time
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.integration import test_worker
from tests.integration.test_worker import wait_until

start_worker = test_worker.start_worker  # the fixture, for these tests too

SECOND = dt.timedelta(seconds=1)


def ticks_of(conn: psycopg.Connection[Any], schema: str = "public") -> list[tuple[Any, ...]]:
    """(tick, lateness in seconds) of each job of a tick, by tick."""
    return conn.execute(
        f'SELECT tick, extract(epoch FROM created_at - tick)::float FROM "{schema}".jobs '
        "WHERE tick IS NOT NULL ORDER BY tick"
    ).fetchall()


@pytest.mark.slow
def test_four_workers_killed_and_restarted_enqueue_exactly_one_job_per_tick(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    added = run_cli(
        "schedule", "add", "beat", "--every", "1s", "k", '{"argv": ["true"]}', "--dsn", dsn,
        "--overlap", "allow",
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    args = ("--concurrency", "2", "--lease", "3s", "--reap-every", "1s")
    workers = [start_worker(dsn, *args) for _ in range(4)]
    started = time.monotonic()
    kills = 0
    rng = random.Random(15)
    while time.monotonic() - started < 20:
        time.sleep(rng.uniform(1.0, 2.5))
        victim = rng.randrange(len(workers))
        workers[victim].proc.kill()  # SIGKILL: mid-tick, mid-job, wherever it is
        workers[victim].proc.wait()
        kills += 1
        workers[victim] = start_worker(dsn, *args)
    for w in workers:
        w.wait_for_log(" started: ")  # its signal handlers are in place
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.finish() == 0
    assert kills >= 8

    rows = ticks_of(conn)
    found = [tick for tick, _ in rows]
    assert len(found) == len(set(found))  # exactly one job per tick
    # No tick missing: every second from the first tick after the schedule
    # was added to the last, each enqueued on time (within the grace).
    [created] = conn.execute("SELECT created_at FROM schedules").fetchone() or [None]
    first = created.replace(microsecond=0) + SECOND
    assert found[0] == first
    assert found == [first + n * SECOND for n in range(len(found))]
    assert len(found) >= 20
    assert max(late for _, late in rows) < 5.0
    # The jobs ran, each told its tick.
    [schedules] = conn.execute("SELECT count(DISTINCT schedule) FROM jobs").fetchone() or [0]
    assert schedules == 1


def test_a_job_of_a_tick_gets_its_schedule_and_tick_in_its_environment(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Any
) -> None:
    out = tmp_path / "seen"
    script = f'echo "$PGQCTL_SCHEDULE $PGQCTL_TICK $PGQCTL_JOB_ID" >> {out}'
    payload = json.dumps({"argv": ["sh", "-c", script]})
    assert (
        run_cli("schedule", "add", "env", "--every", "1s", "k", payload, "--dsn", dsn).exit_code
        == 0
    )
    worker = start_worker(dsn, "--no-reap")
    wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, 15, "two ticks")
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    for line in out.read_text().splitlines():
        name, tick, job_id = line.split()
        [stored] = conn.execute(
            "SELECT tick FROM jobs WHERE id = %s", (int(job_id),)
        ).fetchone() or [None]
        assert name == "env"
        assert tick == stored.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "schedule tick(s): env 20" in worker.log


def test_a_worker_with_no_schedules_enqueues_no_tick(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    assert run_cli("schedule", "add", "b", "--every", "1s", "k", "--dsn", dsn).exit_code == 0
    worker = start_worker(dsn, "--no-schedules", "--handler", "k=true")
    worker.wait_for_log("started")
    time.sleep(2.5)
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    assert ticks_of(conn) == []


@pytest.mark.slow
def test_catch_up_after_every_worker_stopped_enqueues_what_it_promises(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    # One schema per --catch-up, side by side, each with its schedule and workers.
    modes = ("latest", "none", "all")
    for mode in modes:
        migrated = run_cli("migrate", "--dsn", dsn, "--schema", f"s_{mode}")
        assert migrated.exit_code == 0, migrated.stderr
        added = run_cli(
            "schedule", "add", "beat", "--every", "1s", "k", "--dsn", dsn, "--schema", f"s_{mode}",
            "--overlap", "allow",
        )  # fmt: skip
        assert added.exit_code == 0
    first = {
        mode: start_worker(dsn, "--schema", f"s_{mode}", "--handler", "k=true") for mode in modes
    }
    wait_until(lambda: all(len(ticks_of(conn, f"s_{m}")) >= 2 for m in modes), 20, "ticks enqueued")
    for w in first.values():
        w.signal(signal.SIGTERM)
    for w in first.values():
        assert w.finish() == 0
    before = {m: [t for t, _ in ticks_of(conn, f"s_{m}")] for m in modes}
    # No worker at all for 11 s: 11 ticks go by, at least 5 of them missed
    # (not enqueued within the 5 s grace) by the time a worker comes back.
    time.sleep(11)
    for mode in modes:
        back = run_cli(
            "worker", "--dsn", dsn, "--schema", f"s_{mode}", "--burst", "--catch-up", mode,
            "--handler", "k=true",
        )  # fmt: skip
        assert back.exit_code == 0, back.stderr

    for mode in modes:
        rows = ticks_of(conn, f"s_{mode}")
        after = [(t, late) for t, late in rows if t > before[mode][-1]]
        ticks = [t for t, _ in after]
        last_before = before[mode][-1]
        assert ticks, mode
        # Whatever the mode, from its first tick on nothing is missing, up
        # to the last tick due when the worker came back.
        assert ticks == [ticks[0] + n * SECOND for n in range(len(ticks))], mode
        missed = [late for _, late in after if late >= 5.0]
        skipped = int((ticks[0] - last_before) / SECOND) - 1
        if mode == "all":
            assert skipped == 0 and len(missed) >= 5  # every missed tick
        elif mode == "latest":
            # One job for the most recent missed tick, then those on time.
            assert len(missed) == 1 and after[0][1] >= 5.0 and after[1][1] < 5.5
            assert skipped >= 4
        else:
            assert missed == [] and skipped >= 5  # none of the missed ticks
