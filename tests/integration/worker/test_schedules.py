"""Schedules ticked by workers: the statement that enqueues ticks, one job per
tick from a fleet whose workers are killed with `kill -9` and restarted, a
schedule whose previous tick's job has not ended skipping its ticks (overlap
skip), and catch-up after every worker was stopped.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import signal
import time
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from cronsim import CronSim

from pgqctl import db, ticks
from tests.conftest import run_cli
from tests.support.processes import start_worker, wait_until

__all__ = ["start_worker"]  # a fixture

UTC = dt.timezone.utc
# One job per tick, whether or not the previous one has ended.
ALLOW = ("--overlap", "allow")


def ticker_at(conn: db.QueueConnection, now: dt.datetime, catch_up: str) -> ticks.Ticker:
    """A worker's ticker that believes the database's clock says `now`."""
    ticker = ticks.Ticker(catch_up)
    ticker._read(conn)
    ticker.db_now, ticker.read_at = now, ticker.clock()
    return ticker


def cli(dsn: str, *args: str, input: str | None = None) -> Any:
    return run_cli(*args, "--dsn", dsn, input=input)


def enqueue_due(dsn: str, now: dt.datetime) -> list[Any]:
    """What a worker's ticker enqueues when the database's clock says `now`."""
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        ticker = ticker_at(queue_conn, now, "all")
        return ticker._enqueue(queue_conn, ticker._due())


SECOND = dt.timedelta(seconds=1)


def ticks_of(conn: psycopg.Connection[Any], schema: str = "public") -> list[tuple[Any, ...]]:
    """(tick, lateness in seconds) of each job of a tick, by tick."""
    return conn.execute(
        f'SELECT tick, extract(epoch FROM created_at - tick)::float FROM "{schema}".jobs '
        "WHERE tick IS NOT NULL ORDER BY tick"
    ).fetchall()


def test_enqueued_ticks_of_a_cron_in_a_daylight_saving_zone_are_the_librarys(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expr, zone = "30 2 * * *", "Europe/Paris"
    assert (
        cli(dsn, "schedule", "add", "n", "--cron", expr, "--timezone", zone, "k", *ALLOW).exit_code
        == 0
    )
    # From before the autumn change (02:30 comes twice on 2026-10-25) to after it.
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = dt.datetime(2026, 10, 28, 12, tzinfo=UTC)
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        ticker = ticker_at(queue_conn, now, "all")
        ticker._enqueue(queue_conn, ticker._due())
    stored = [r[0] for r in conn.execute("SELECT tick FROM jobs ORDER BY tick").fetchall()]
    expected = []
    for tick in CronSim(expr, start.astimezone(ZoneInfo(zone))):
        if tick > now:
            break
        expected.append(tick.astimezone(UTC))
    assert stored == expected and len(expected) == 7  # the 25th once
    [last] = conn.execute("SELECT last_tick FROM schedules").fetchone() or [None]
    assert last == expected[-1]


def test_a_purged_tick_is_never_enqueued_again_even_by_a_stale_worker(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert cli(dsn, "schedule", "add", "n", "--every", "1m", "k", *ALLOW).exit_code == 0
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = start + dt.timedelta(minutes=3, seconds=30)
    with db.open_queue(dsn, schema="public", writes=True) as queue_conn:
        stale = ticker_at(queue_conn, now, "all")  # reads the schedule, then sleeps
        fresh = ticker_at(queue_conn, now, "all")
        [done] = fresh._enqueue(queue_conn, fresh._due())
        assert len(done.jobs) == 3
        conn.execute("UPDATE jobs SET status = 'done'")
        assert cli(dsn, "purge", "--older-than", "1ms").exit_code == 0
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
        # The stale worker still believes those ticks due: the schedule's
        # last_tick refuses them, though no job holds them any more.
        assert stale._enqueue(queue_conn, stale._due()) == []
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_workers_racing_on_the_same_ticks_make_one_job_per_tick(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    import threading

    assert cli(dsn, "schedule", "add", "n", "--every", "1m", "k", *ALLOW).exit_code == 0
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    now = start + dt.timedelta(minutes=50, seconds=30)
    racers = 8
    connections = [db.open_queue(dsn, schema="public", writes=True) for _ in range(racers)]
    tickers = [ticker_at(c, now, "all") for c in connections]
    ready = threading.Barrier(racers)
    made: list[int] = []

    def race(ticker: ticks.Ticker, queue_conn: db.QueueConnection) -> None:
        wanted = ticker._due()
        ready.wait()
        for enqueued in ticker._enqueue(queue_conn, wanted):
            made.extend(enqueued.jobs)  # list.extend holds the GIL: safe across threads

    threads = [
        threading.Thread(target=race, args=(t, c))
        for t, c in zip(tickers, connections, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in connections:
        c.close()
    rows = conn.execute("SELECT tick, count(*) FROM jobs GROUP BY tick ORDER BY tick").fetchall()
    assert [count for _, count in rows] == [1] * 50  # every tick once, none twice
    assert sorted(made) == sorted(r[0] for r in conn.execute("SELECT id FROM jobs").fetchall())
    [last] = conn.execute("SELECT last_tick FROM schedules").fetchone() or [None]
    assert last == rows[-1][0]


def test_a_tick_while_the_previous_ticks_job_is_pending_or_running_is_skipped(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert cli(dsn, "schedule", "add", "slow", "--every", "1m", "k").exit_code == 0
    many = cli(dsn, "schedule", "add", "many", "--every", "1m", "k", "--overlap", "allow")
    assert many.exit_code == 0, many.stderr
    start = dt.datetime(2026, 10, 22, tzinfo=UTC)
    conn.execute("UPDATE schedules SET ticks_after = %s", (start,))
    minute = dt.timedelta(minutes=1)

    def jobs(name: str) -> list[tuple[Any, ...]]:
        return conn.execute(
            "SELECT tick, status FROM jobs WHERE schedule = %s ORDER BY tick", (name,)
        ).fetchall()

    def shown(name: str) -> dict[str, Any]:
        return json.loads(cli(dsn, "schedule", "show", name, "--json").stdout)

    # Three ticks due at once (catch-up all): skip enqueues the latest only.
    enqueue_due(dsn, start + 3 * minute + dt.timedelta(seconds=1))
    assert jobs("slow") == [(start + 3 * minute, "pending")]
    assert len(jobs("many")) == 3
    record = shown("slow")
    assert (record["overlap"], record["skipped_ticks"]) == ("skip", 2)
    assert record["last_skipped_tick"] == "2026-10-22T00:02:00+00:00"

    # The next tick while that job runs: skipped, and done with all the same.
    conn.execute("UPDATE jobs SET status = 'running' WHERE schedule = 'slow'")
    [skipped] = [e for e in enqueue_due(dsn, start + 4 * minute) if e.schedule == "slow"]
    assert (skipped.jobs, skipped.skipped) == ((), (start + 4 * minute,))
    assert len(jobs("slow")) == 1 and len(jobs("many")) == 4
    record = shown("slow")
    assert (record["skipped_ticks"], record["last_tick"]) == (3, "2026-10-22T00:04:00+00:00")

    # Once it has ended, the next tick is enqueued.
    conn.execute("UPDATE jobs SET status = 'done' WHERE schedule = 'slow'")
    enqueue_due(dsn, start + 5 * minute)
    assert jobs("slow")[-1] == (start + 5 * minute, "pending")
    assert shown("slow")["skipped_ticks"] == 3


def test_a_slow_job_of_a_secondly_schedule_does_not_pile_up_behind_itself(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    payload = '{"argv": ["sleep", "2.5"]}'
    added = cli(dsn, "schedule", "add", "slow", "--every", "1s", "k", payload)
    assert added.exit_code == 0, added.stderr
    worker = start_worker(dsn, "--concurrency", "4", "--no-reap")
    worker.wait_for_log(" started: ")
    most = 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        [(live,)] = conn.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')"
        ).fetchall()
        most = max(most, live)
        time.sleep(0.05)
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0
    [(made,)] = conn.execute("SELECT count(*) FROM jobs").fetchall()
    print(f"6 s of a 1 s schedule of 2.5 s jobs: {made} jobs, at most {most} at once")
    assert most == 1  # one job of the schedule at a time: no backlog
    [(skipped,)] = conn.execute("SELECT skipped_ticks FROM schedules").fetchall()
    assert skipped >= 3 and made <= 4
    assert "schedule tick(s) (overlap skip" in worker.log


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
