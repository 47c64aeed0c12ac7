"""Claims restricted to queues and kinds: order, isolation, and no double claim.

A worker that serves some queues (or kinds) claims through each one's own
range of a claim index, so what it reads does not grow with what the others
hold. The plan assertions count the rows the statement reads from `jobs`
(EXPLAIN ANALYZE), both as the worker runs it (one cached generic plan) and
as it runs unprepared behind a pooler (a custom plan each time).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqctl import attempts, claims, db, limits
from pgqctl.sql import query
from tests.support.plans import PLANS, plan_of, rows_read
from tests.support.processes import start_worker

__all__ = ["start_worker"]  # a fixture

LEASE = 60.0

# (queue, kind, priority, seconds ago the job became due): inserted in this
# order, so ids follow it, and neither priority nor run_at does.
DUE = [
    ("a", "x", 0, 50),
    ("b", "x", 5, 10),
    ("c", "x", 9, 90),
    ("a", "y", 5, 10),
    ("b", "y", 0, 70),
    ("a", "x", 5, 30),
    ("c", "y", 0, 99),
    ("b", "x", 0, 50),
    ("a", "y", 0, 50),
    ("b", "y", 5, 30),
    ("a", "x", -3, 95),
    ("c", "x", 5, 10),
    ("b", "x", 5, 10),
    ("a", "y", 0, 70),
]


def add(conn: psycopg.Connection[Any], rows: Sequence[tuple[str, str, int, float]]) -> list[int]:
    """Jobs from (queue, kind, priority, seconds ago due; negative: not due yet) rows."""
    found = conn.execute(
        "INSERT INTO jobs (queue, kind, payload, priority, run_at) "
        "SELECT q, k, '{}', p, now() - s * interval '1 second' "
        "FROM unnest(%s::text[], %s::text[], %s::int[], %s::float8[]) WITH ORDINALITY "
        "AS t(q, k, p, s, n) ORDER BY n RETURNING id",
        ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]),
    ).fetchall()
    return [r[0] for r in found]


def claim_order(
    conn: psycopg.Connection[Any], queues: Sequence[str] = (), kinds: Sequence[str] = ()
) -> list[int]:
    """The pending due jobs these filters select, in claim order, by Python's reckoning."""
    rows = conn.execute(
        "SELECT id, queue, kind, priority, run_at FROM jobs "
        "WHERE status = 'pending' AND run_at <= now()"
    ).fetchall()
    chosen = [r for r in rows if (not queues or r[1] in queues) and (not kinds or r[2] in kinds)]
    return [r[0] for r in sorted(chosen, key=lambda r: (-r[3], r[4], r[0]))]


@pytest.fixture(params=PLANS)
def claimer(request: pytest.FixtureRequest, dsn: str) -> Iterator[db.QueueConnection]:
    """A connection whose exchanges run on a generic plan (prepared at once,
    as the worker's are after a few runs) or unprepared (as behind a pooler)."""
    conn = db.connect(dsn, schema="public")
    conn.prepare_threshold = 0 if request.param == "generic" else None
    conn.plan = request.param  # type: ignore[attr-defined]
    yield conn
    conn.close()


def exchange(conn: Any, **kwargs: Any) -> claims.Exchanged:
    """One exchange in a transaction of its own, on the connection's kind of plan."""
    mode = "force_generic_plan" if conn.plan == "generic" else "force_custom_plan"
    with conn.transaction():
        conn.execute("SELECT set_config('plan_cache_mode', %s, true)", (mode,))
        return claims.exchange(conn, lease=LEASE, worker="t", **kwargs)


def drain(conn: Any, batch: int, **filters: Any) -> list[int]:
    """Claim `batch` at a time until nothing is left; every id, in the order claimed."""
    got: list[int] = []
    while True:
        ids = [j.id for j in exchange(conn, claim=batch, **filters).claimed]
        if not ids:
            return got
        got += ids


# -- order and selection ------------------------------------------------------


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"queues": ["a"]},
        {"queues": ["a", "b"]},
        {"queues": ["c", "a", "b"]},
        {"kinds": ["y"]},
        {"kinds": ["x", "y"]},
        {"queues": ["a", "b"], "kinds": ["x"]},
        {"queues": ["b"], "kinds": ["y", "x"]},
    ],
    ids=lambda f: ",".join(f"{k}={'+'.join(v)}" for k, v in f.items()) or "all",
)
def test_claims_follow_priority_then_run_at_then_id_across_what_the_worker_serves(
    conn: psycopg.Connection[Any], claimer: Any, filters: dict[str, list[str]]
) -> None:
    add(conn, DUE)
    add(conn, [("a", "x", 9, -60), ("b", "y", 9, -60)])  # not due yet: never claimed
    expected = claim_order(conn, **filters)
    assert len(expected) >= 4
    # Batches smaller than any one queue's share: each claim merges the
    # queues' walks and cuts the merge.
    assert drain(claimer, 3, **filters) == expected
    left = {r[0] for r in conn.execute("SELECT id FROM jobs WHERE status = 'pending'")}
    assert left.isdisjoint(expected)


def test_one_claim_returns_its_jobs_in_claim_order(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    add(conn, DUE)
    expected = claim_order(conn, queues=["a", "b"])
    got = exchange(claimer, claim=len(expected) + 5, queues=["b", "a"]).claimed
    assert [j.id for j in got] == expected


def test_a_queue_or_kind_given_twice_counts_once(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    add(conn, DUE)
    expected = claim_order(conn, queues=["a"])[:4]
    got = exchange(claimer, claim=4, slots=[7, 3, 5, 1], queues=["a", "a"]).claimed
    assert [j.id for j in got] == expected
    # The n-th job claimed is held in the n-th slot.
    held = dict(conn.execute("SELECT id, locked_by FROM jobs WHERE status = 'running'"))
    assert [held[i] for i in expected] == ["t:7", "t:3", "t:5", "t:1"]
    expected = claim_order(conn, kinds=["y"])[:3]
    got = exchange(claimer, claim=3, kinds=["y", "y"]).claimed
    assert [j.id for j in got] == expected


def test_a_queue_or_kind_that_holds_nothing_claims_nothing(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    add(conn, DUE)
    assert exchange(claimer, claim=5, queues=["nowhere"]).claimed == []
    assert exchange(claimer, claim=5, kinds=["nothing"]).claimed == []
    assert exchange(claimer, claim=5, queues=["c"], kinds=["nothing"]).claimed == []
    assert exchange(claimer, claim=0, queues=["a"]).claimed == []
    assert conn.execute("SELECT count(*) FROM jobs WHERE status <> 'pending'").fetchone() == (0,)


def test_next_due_is_the_soonest_delayed_job_the_worker_serves(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    add(conn, DUE)
    add(conn, [("a", "x", 0, -500), ("a", "y", 9, -300), ("b", "x", -1, -100)])
    add(conn, [("c", "y", 0, -50)])

    def due(**filters: Any) -> float | None:
        mode = "force_generic_plan" if claimer.plan == "generic" else "force_custom_plan"
        with claimer.transaction():
            claimer.execute("SELECT set_config('plan_cache_mode', %s, true)", (mode,))
            return claims.next_due(claimer, **filters)

    def near(value: float | None, seconds: float) -> bool:
        return value is not None and abs(value - seconds) < 30

    assert near(due(), 50)
    assert near(due(queues=["a"]), 300)
    assert near(due(queues=["a", "b"]), 100)
    assert near(due(queues=["a"], kinds=["x"]), 500)
    assert near(due(kinds=["x"]), 100)
    assert near(due(kinds=["y"]), 50)
    assert due(queues=["c"], kinds=["x"]) is None
    assert due(queues=["nowhere"]) is None


def test_next_due_agrees_with_the_smallest_delayed_run_at(
    conn: psycopg.Connection[Any], claimer: Any
) -> None:
    # Many priority levels, delayed jobs at each, due ones in between.
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, priority, run_at) "
        "SELECT (ARRAY['a', 'b', 'c'])[1 + i % 3], (ARRAY['x', 'y', 'z'])[1 + i * 7 % 3], "
        "       '{}', i * 13 % 7 - 3, now() + (i * 37 % 1100 - 100) * interval '1 second' "
        "FROM generate_series(1, 2000) AS i"
    )
    conn.execute("ANALYZE jobs")
    naive = (
        "SELECT extract(epoch FROM min(run_at) - now())::float8 FROM jobs "
        "WHERE status = 'pending' AND run_at > now() "
        "AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[])) "
        "AND (%(kinds)s::text[] IS NULL OR kind = ANY(%(kinds)s::text[]))"
    )
    mode = "force_generic_plan" if claimer.plan == "generic" else "force_custom_plan"
    for queues in [None, ["a"], ["b", "c"], ["nowhere"]]:
        for kinds in [None, ["x"], ["y", "z"]]:
            with claimer.transaction():
                claimer.execute("SELECT set_config('plan_cache_mode', %s, true)", (mode,))
                got = claims.next_due(claimer, queues=queues or (), kinds=kinds or ())
            row = conn.execute(naive, {"queues": queues, "kinds": kinds}).fetchone()
            want = None if row is None else row[0]
            if want is None:
                assert got is None, (queues, kinds)
            else:
                assert got is not None and abs(got - want) < 1, (queues, kinds, got, want)


# -- what a claim reads ---------------------------------------------------------


def claim_params(limit: int, **filters: Any) -> dict[str, Any]:
    return {
        "done": "[]",
        "failed": "[]",
        "handed_back": "[]",
        "reason": "",
        "renew": "[]",
        "limit": limit,
        "slots": None,
        "lease": LEASE,
        "worker": "t",
        "queues": filters.get("queues"),
        "kinds": filters.get("kinds"),
        "payload_chars": limits.MAX_PAYLOAD_BYTES + 1,
    }


@pytest.fixture
def backlog(conn: psycopg.Connection[Any]) -> None:
    """Backlogs first in claim order (higher priority, older): 6,000 due jobs
    of queue b, then 6,000 of queue a, all of kind z, and 3,000 of b's not
    due yet; then the jobs of kinds x and y, and a few delayed ones."""
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, priority, run_at) "
        "SELECT q, 'z', '{}', 5, now() + t * interval '1 hour' "
        "FROM (VALUES ('b', -2, 6000), ('a', -1, 6000), ('b', 1, 3000)) AS v(q, t, n), "
        "     generate_series(1, n)"
    )
    add(conn, [("a", "x", 0, 10)] * 20 + [("a", "y", 0, 10)] * 20 + [("b", "x", 0, 10)] * 20)
    add(conn, [("a", "x", 0, -60)] * 5 + [("a", "y", 0, -60)] * 5)
    conn.execute("VACUUM ANALYZE jobs")


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize(
    "filters",
    [{"queues": ["a"]}, {"queues": ["a", "c"]}, {"kinds": ["x"]}, {"kinds": ["x", "y"]}],
    ids=["queue", "queues", "kind", "kinds"],
)
def test_a_claim_reads_none_of_the_backlog_it_does_not_serve(
    dsn: str, backlog: None, plan: str, filters: dict[str, list[str]]
) -> None:
    # Walking the claim index, a worker of queue a would read queue b's
    # 6,000 due jobs first; a worker of kinds x and y, 12,000 of kind z.
    with db.connect(dsn, schema="public") as conn:
        statement = claims.exchange_statement(**filters)
        explained = plan_of(conn, statement, claim_params(5, **filters), plan)
    # The walk's 5 rows, the claim's 5 updates and their lookups.
    assert rows_read(explained) <= 20, json.dumps(explained, indent=1)


@pytest.mark.parametrize("plan", PLANS)
def test_a_claim_of_a_queue_and_kind_reads_no_other_queue(
    dsn: str, conn: psycopg.Connection[Any], plan: str
) -> None:
    # Kind x everywhere, 5,000 due in queue b before queue a's in claim order.
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, priority) "
        "SELECT 'b', 'x', '{}', 5 FROM generate_series(1, 5000)"
    )
    add(conn, [("a", "x", 0, 10)] * 10)
    conn.execute("VACUUM ANALYZE jobs")
    with db.connect(dsn, schema="public") as c:
        statement = claims.exchange_statement(queues=["a"], kinds=["x"])
        params = claim_params(5, queues=["a"], kinds=["x"])
        explained = plan_of(c, statement, params, plan)
    assert rows_read(explained) <= 20, json.dumps(explained, indent=1)


@pytest.mark.parametrize("plan", PLANS)
def test_the_unrestricted_claim_still_takes_the_first_jobs_in_order(
    dsn: str, backlog: None, plan: str
) -> None:
    with db.connect(dsn, schema="public") as conn:
        explained = plan_of(conn, claims.exchange_statement(), claim_params(5), plan)
    assert rows_read(explained) <= 20, json.dumps(explained, indent=1)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("filters", [{"queues": ["a"]}, {"kinds": ["x"]}], ids=["queue", "kind"])
def test_next_due_reads_none_of_the_backlog_it_does_not_serve(
    dsn: str, backlog: None, plan: str, filters: dict[str, list[str]]
) -> None:
    with db.connect(dsn, schema="public") as conn:
        params = {"queues": None, "kinds": None, **filters}
        name = "job_next_due_queues" if "queues" in filters else "job_next_due_kinds"
        explained = plan_of(conn, query(name), params, plan)
    # Its own 5 delayed jobs, none of queue b's 3,000 (of kind z).
    assert rows_read(explained) <= 10, json.dumps(explained, indent=1)


@pytest.mark.parametrize("plan", PLANS)
def test_recording_attempts_reads_one_job_per_record_whatever_the_backlog(
    dsn: str, conn: psycopg.Connection[Any], backlog: None, plan: str
) -> None:
    # The records come as a JSON set the planner guesses at 100 rows: joined
    # to jobs as a plain join, it hashed all 15,000 of them on every exchange.
    ids = [row[0] for row in conn.execute("SELECT id FROM jobs ORDER BY id DESC LIMIT 3")]
    records = [
        attempts.Record(
            job_id=i,
            claim=1,
            attempt=1,
            worker="h:1:0",
            outcome="done",
            claimed=0.2,
            started=0.1,
            ended=0.3,
        )
        for i in ids
    ]
    with db.connect(dsn, schema="public") as c:
        params = attempts.record_params(records, now=0.3)
        explained = plan_of(c, query("attempt_record"), params, plan)
    assert rows_read(explained) == 3, json.dumps(explained, indent=1)


# -- concurrency ---------------------------------------------------------------


def test_concurrent_claimers_over_overlapping_queues_and_kinds_claim_each_job_once(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    queues, kinds = ["a", "b", "c"], ["x", "y"]
    rows = [(queues[i % 3], kinds[i % 2], i % 4, i % 7) for i in range(900)]
    ids = add(conn, rows)
    serving: list[dict[str, Any]] = [
        {"queues": ["a", "b"]},
        {"queues": ["b", "a"]},
        {"queues": ["c", "a"], "kinds": ["x"]},
        {"kinds": ["y", "x"]},
        {"kinds": ["x"]},
        {},
    ]
    start = threading.Barrier(len(serving))
    claimed: list[list[int]] = [[] for _ in serving]
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with db.connect(dsn, schema="public") as c:
                start.wait(timeout=30)
                held: list[tuple[int, int]] = []
                while True:
                    got = claims.exchange(
                        c, done=held, claim=7, lease=LEASE, worker=f"w{n}", **serving[n]
                    )
                    assert got.done == {i for i, _ in held}
                    if not got.claimed:
                        return
                    claimed[n] += [j.id for j in got.claimed]
                    held = [j.held for j in got.claimed]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(len(serving))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    every = [i for got in claimed for i in got]
    assert len(every) == len(set(every)), "a job was claimed twice"
    assert sorted(every) == ids
    assert conn.execute(
        "SELECT status, max(attempts), count(*) FROM jobs GROUP BY 1"
    ).fetchall() == [("done", 1, 900)]
    # Each claimer got only what it serves.
    kind_of = {i: (q, k) for i, (q, k, _, _) in zip(ids, rows, strict=True)}
    for got, filters in zip(claimed, serving, strict=True):
        for i in got:
            q, k = kind_of[i]
            assert q in filters.get("queues", [q]) and k in filters.get("kinds", [k])


def test_worker_processes_of_several_queues_run_each_job_once(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path, start_worker: Any
) -> None:
    ran = tmp_path / "ran"
    script = 'echo "$PGQCTL_JOB_ID" >> "$1"'
    payload = json.dumps({"argv": ["sh", "-c", script, "sh", str(ran)]})
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, priority, run_at) "
        "SELECT (ARRAY['a', 'b', 'c'])[i %% 3 + 1], (ARRAY['x', 'y'])[i %% 2 + 1], %s, i %% 3, "
        "       now() - i * interval '1 millisecond' "
        "FROM generate_series(1, 240) AS i",
        (payload,),
    )
    ids = sorted(r[0] for r in conn.execute("SELECT id FROM jobs"))
    command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst"]
    args = [
        ["--queue", "a", "--queue", "b"],
        ["--queue", "b", "--queue", "c"],
        ["--kind", "x", "--kind", "y", "--queue", "c", "--queue", "a"],
        ["--kind", "y"],
    ]
    procs = [start_worker(dsn, "--burst", "--concurrency", "4", *a) for a in args]
    codes = [p.wait(120) for p in procs]
    outputs = [p.log for p in procs]
    assert codes == [0] * len(procs), outputs
    # A burst worker stops when all it sees is taken: what others held then
    # and gave up is left for one more.
    final = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert final.returncode == 0, final.stderr
    assert sorted(int(line) for line in ran.read_text().split()) == ids
    assert conn.execute(
        "SELECT status, max(attempts), count(*) FROM jobs GROUP BY 1"
    ).fetchall() == [("done", 1, 240)]
    started = re.findall(r"job (\d+) started", "".join(outputs) + final.stderr)
    assert sorted(int(i) for i in started) == ids
