"""Claims that walk from a floor: cheap while a transaction holds the horizon.

Every job a worker claims leaves an entry in the claim index, ahead of every
pending job, until vacuum removes it; while a transaction anywhere holds back
the xmin horizon nothing removes it, and a claim walking from the index's
start visits every one. A worker of all queues claims from where its claims
stood instead (claims.Floor), walking from the start once a second for jobs
due behind that point. These tests hold a real transaction open in another
session and count the buffers a claim touches, as EXPLAIN ANALYZE reports
them, for the plan the worker runs (generic) and the one behind a pooler.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgqctl import claims, db
from tests.integration.worker.test_claim_queues import (
    LEASE,
    add,
    claim_order,
    claim_params,
)
from tests.support.plans import PLANS, plan_of, rows_read

CHURNED = 10_000


def buffers(explained: list[dict[str, Any]]) -> int:
    """Shared buffers the statement touched (hit or read), its nodes' sum."""
    top = explained[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def floor_params(limit: int, floor: claims.Floor) -> dict[str, Any]:
    return {
        **claim_params(limit),
        "floor_priority": floor.priority,
        "floor_run_at": floor.run_at,
        "floor_id": floor.id,
    }


def run_through(conn: db.QueueConnection, batch: int) -> claims.Floor | None:
    """Claim every due job `batch` at a time from the floor, reporting each
    batch done with the next claim, as a worker does; the last floor."""
    floor: claims.Floor | None = None
    done: list[tuple[int, int]] = []
    while True:
        got = claims.exchange(conn, done=done, claim=batch, lease=LEASE, worker="t", floor=floor)
        if not got.claimed:
            return floor
        done = [(j.id, j.attempts) for j in got.claimed]
        floor = got.last_claimed or floor


@pytest.fixture
def holder(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A session idle in a transaction that holds an xid: the xmin horizon stays."""
    with psycopg.connect(dsn, application_name="holder") as c:
        c.execute("SELECT txid_current()")
        yield c
        c.rollback()


@pytest.mark.parametrize("plan", PLANS)
def test_a_claim_from_the_floor_reads_none_of_the_jobs_run_while_the_horizon_is_held(
    dsn: str, conn: psycopg.Connection[Any], holder: psycopg.Connection[Any], plan: str
) -> None:
    seen: list[tuple[int, int]] = []  # (from the start, from the floor) buffers
    with db.connect(dsn, schema="public") as worker:
        for _ in range(2):
            add(conn, [("default", "x", 0, 30)] * CHURNED)
            floor = run_through(worker, 100)
            assert floor is not None
            add(conn, [("default", "x", 0, 1)] * 10)
            statement = claims.exchange_statement(from_floor=True)
            from_floor = plan_of(worker, statement, floor_params(4, floor), plan)
            from_start = plan_of(worker, claims.exchange_statement(), claim_params(4), plan)
            assert rows_read(from_floor) <= 20, json.dumps(from_floor, indent=1)
            seen.append((buffers(from_start), buffers(from_floor)))
    # From the start, the walk visits every job run since the holder began:
    # their entries are still in the index, and no vacuum may remove them.
    # From the floor it reads what it takes, however many ran before.
    (start_1, floor_1), (start_2, floor_2) = seen
    assert start_2 - start_1 > 100, seen
    assert floor_2 - floor_1 <= 5 and floor_2 < start_1 / 3, seen


@pytest.mark.parametrize("plan", PLANS)
def test_the_pause_check_keeps_the_claim_from_the_floor_on_its_index(
    dsn: str, conn: psycopg.Connection[Any], plan: str
) -> None:
    # As for the claim from the start (test_pause): one queue's statistics
    # must not turn the walk into a sort of the whole backlog.
    add(conn, [("default", "x", 0, 10)] * 3000)
    conn.execute("VACUUM ANALYZE jobs")
    first = conn.execute("SELECT run_at, id FROM jobs ORDER BY id LIMIT 1").fetchone()
    assert first is not None
    with db.connect(dsn, schema="public") as c:
        statement = claims.exchange_statement(from_floor=True)
        params = floor_params(5, claims.Floor(0, first[0], first[1]))
        explained = plan_of(c, statement, params, plan)
    assert rows_read(explained) <= 20, json.dumps(explained, indent=1)


def test_claims_from_the_floor_keep_claim_order_across_priorities(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    rows = [("default", "x", p, s) for p in (5, 0, -3) for s in (90, 60, 30, 10)]
    add(conn, rows)
    expected = claim_order(conn)
    got: list[int] = []
    floor: claims.Floor | None = None
    with db.connect(dsn, schema="public") as c:
        while True:
            claimed = claims.exchange(c, claim=3, lease=LEASE, worker="t", floor=floor)
            if not claimed.claimed:
                break
            got += [j.id for j in claimed.claimed]
            assert claimed.last_claimed is not None
            assert claimed.last_claimed.id == claimed.claimed[-1].id
            floor = claimed.last_claimed
            if len(got) == 6:
                # A job of a higher priority, and one of the floor's own
                # priority due later: both are seen from the floor, in order.
                higher, later = add(conn, [("default", "x", 9, 1), ("default", "x", 0, 0)])
                expected = [*expected[:6], higher, *expected[6:8], later, *expected[8:]]
    assert got == expected


def test_a_job_due_behind_the_floor_waits_for_the_next_walk_from_the_start(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    add(conn, [("default", "x", 0, 10)] * 4)
    with db.connect(dsn, schema="public") as c:
        floor = claims.exchange(c, claim=4, lease=LEASE, worker="t").last_claimed
        assert floor is not None
        # Due a minute ago, but committed after the floor's jobs were claimed
        # (a --run-at in the past, a producer's long transaction).
        [late] = add(conn, [("default", "x", 0, 60)])
        assert claims.exchange(c, claim=4, lease=LEASE, worker="t", floor=floor).claimed == []
        walked = claims.exchange(c, claim=4, lease=LEASE, worker="t")
        assert [j.id for j in walked.claimed] == [late]


def test_floors_lag_the_last_claim_and_walk_from_the_start_once_a_second() -> None:
    floors = claims.Floors()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    first, second = claims.Floor(0, at, 1), claims.Floor(0, at, 2)
    assert floors.floor(100.0) is None  # the first claim walks from the start
    floors.claimed(100.0, first)
    assert floors.floor(100.5) is None  # nothing claimed a second ago: from the start
    floors.claimed(100.5, second)
    assert floors.floor(101.2) == first  # claimed 1.2 s ago; `second` only 0.7 s
    assert floors.floor(101.6) is None  # a second since the last walk from the start
    assert floors.floor(101.9) == second
    floors.claimed(101.9, None)  # a claim that took nothing moves nothing
    assert floors.floor(102.5) == second
    assert floors.floor(102.7) is None
    assert claims.Floors(enabled=False).floor(0.0) is None


def test_workers_claiming_from_their_floors_take_each_job_once(
    conn: psycopg.Connection[Any], dsn: str, holder: psycopg.Connection[Any]
) -> None:
    # Four claimers, each from its own floor, while jobs keep coming and the
    # horizon is held: every job is claimed, none twice.
    taken: list[list[int]] = [[] for _ in range(4)]
    producing = threading.Event()
    producing.set()

    def claimer(n: int) -> None:
        floors = claims.Floors()
        with db.connect(dsn, schema="public") as c:
            while True:
                now = time.monotonic()
                floor = floors.floor(now)
                got = claims.exchange(c, claim=5, lease=LEASE, worker=f"w{n}", floor=floor)
                floors.claimed(now, got.last_claimed)
                taken[n] += [j.id for j in got.claimed]
                # Done once a walk from the start finds nothing left.
                if not got.claimed and floor is None and not producing.is_set():
                    return

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    ids: list[int] = []
    for _ in range(40):
        ids += add(conn, [("default", "x", 0, 0)] * 50)
    producing.clear()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    everything = [i for got in taken for i in got]
    assert sorted(everything) == sorted(ids)
    assert sum(1 for got in taken if got) >= 2  # they did claim side by side
