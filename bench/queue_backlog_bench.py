"""Does a worker of one queue keep its pace while another queue holds a backlog?

Schemas of one database hold the same jobs of queue A (1,000 due, 100
delayed, kinds a1 and a2):

- `quiet`: nothing else;
- `backlog`: also --backlog pending jobs in queue B, of kind b (95% due,
  5% delayed), all ahead of queue A's in claim order (higher priority,
  older): a claim that walked the claim index past them would read them all;
- `mixed`: also --backlog pending jobs of kind other in queue A itself,
  ahead of a1 and a2 in claim order: what --kind costs next to --queue;
- `bare`: as quiet, without migration 0002's two indexes.

Each round runs every figure on its two sides, the figures in an order that
rotates from round to round. A figure of single statements alternates its
calls between the sides; a drain or a bulk enqueue runs on one side then the
other, the first side rotating. Ratios are taken within a round:

- `claim.queue`: the claim of a `--queue A` worker (an exchange claiming 10,
  the statement alone timed; the jobs are put back between calls), on the
  generic plan the worker runs; `claim.queue.unprepared` with a custom plan
  every time, as behind a pooler. Ratio backlog / quiet, target <= 1.2.
- `drain.queue`: a `--queue A` worker's claim-and-complete path: exchanges
  that report the last batch done and claim the next 10, until --jobs jobs
  (and the 1,000 due) of queue A are done. Ratio backlog / quiet, >= 0.9.
- `next_due.queue`: a `--queue A` worker's look for its next delayed job.
- `claim.all`: the claim of a worker with no --queue (it takes the
  backlog's first jobs: the ratio shows it stays as cheap).
- `claim.kind`: `--kind a1` with the other kind's backlog (queue B's jobs).
- `claim.queue_kind`: `--queue A --kind a1` in `mixed` against quiet: a
  kind filters within the queue, so this one reads queue A's other kinds.
- `enqueue`: `pgqctl.enqueue_many` of 20,000 jobs into `bare` against
  `quiet`: what 0002's indexes cost each write.

Prints `name: median unit (min .. max)` over the rounds, then the ratios.

    python bench/queue_backlog_bench.py [--dsn DSN] [--backlog 1000000] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. It creates and drops a
database of its own. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import throwaway_db
from report import say, summary

from pgqctl import claims, db, enqueue_many, migrate
from pgqctl.jobs import Held
from pgqctl.worker import SESSION_SETTINGS

SCHEMAS = ("quiet", "backlog", "mixed", "bare")
LEASE = 300.0
CLAIM = 10
ENQUEUE_JOBS = 20_000
QUEUE_A_DUE = 1000
WARM_UP = 6

# Queue A's jobs, the same in every schema: due ones at priority 0, delayed ones.
DUE_SET = """
INSERT INTO jobs (queue, kind, payload, run_at)
SELECT 'A', 'a' || (1 + i % 2), '{"argv": ["true"]}', now() - interval '1 minute'
FROM generate_series(1, 1000) AS i
"""
DELAYED_SET = """
INSERT INTO jobs (queue, kind, payload, run_at)
SELECT 'A', 'a' || (1 + i % 2), '{"argv": ["true"]}', now() + interval '1 hour'
FROM generate_series(1, 100) AS i
"""
# `n` jobs ahead of queue A's due ones in claim order: priority 5, older.
# 5% of them are delayed (an hour from now), the rest due.
AHEAD = """
INSERT INTO jobs (queue, kind, payload, priority, run_at)
SELECT %(queue)s, %(kind)s, '{"argv": ["true"]}', 5,
       CASE WHEN i %% 20 = 0 THEN now() + interval '1 hour'
            ELSE now() - interval '1 day' + i * interval '1 millisecond' END
FROM generate_series(1, %(n)s) AS i
"""
DRAIN_SET = """
INSERT INTO jobs (queue, kind, payload, run_at)
SELECT 'A', 'a1', '{"argv": ["true"]}', now() - interval '1 minute'
FROM generate_series(1, %(n)s)
"""
# A claimed job put back as it was (untimed), to be claimed again.
UNCLAIM = """
UPDATE jobs
SET status = 'pending', attempts = attempts - 1, locked_until = NULL, locked_by = NULL
WHERE id = ANY(%(ids)s)
"""
# Puts a schema back as the round found it (untimed): no finished rows, and
# queue A's due jobs again if a drain took them.
TIDY = "DELETE FROM jobs WHERE status = 'done' OR kind = 'enqueued'"
DUE_LEFT = """
SELECT count(*) FROM jobs WHERE queue = 'A' AND status = 'pending' AND run_at <= now()
"""


@dataclass
class Figure:
    unit: str
    sides: tuple[str, str]
    # The round's value of each side: (sides in the order to start with) -> values.
    measure: Callable[[tuple[str, ...]], dict[str, float]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="jobs ahead of queue A")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40, help="statements per side per round")
    args = parser.parse_args()
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    with throwaway_db.server(admin_dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        run(dsn, args)


def run(dsn: str, args: Any) -> None:
    conns = {schema: setup(dsn, schema, args.backlog) for schema in SCHEMAS}
    # Unprepared, as behind a pooler: a custom plan for every statement.
    unprepared = {s: connect(dsn, s, prepared=False) for s in ("quiet", "backlog")}

    def alternating(call: Callable[[str], float], sides: tuple[str, ...]) -> dict[str, float]:
        """Median ms of `call` on each side, the calls alternating between them."""
        times: dict[str, list[float]] = {side: [] for side in sides}
        for side in sides:
            # Untimed: psycopg prepares a statement on its sixth run.
            for _ in range(WARM_UP):
                call(side)
        for n in range(args.calls):
            for side in sides if n % 2 == 0 else sides[::-1]:
                times[side].append(call(side))
        for side in sides:
            vacuum(conns[side])
        return {side: statistics.median(t) * 1000 for side, t in times.items()}

    def claim(pool: dict[str, db.QueueConnection], **filters: Any) -> Callable[[str], float]:
        def call(side: str) -> float:
            conn = pool[side]
            # The statement alone: not the transaction's settings or commit.
            with conn.transaction():
                started = time.perf_counter()
                got = claims.exchange(conn, claim=CLAIM, lease=LEASE, worker="bench", **filters)
                elapsed = time.perf_counter() - started
            if len(got.claimed) != CLAIM:
                raise RuntimeError(f"claimed {len(got.claimed)} jobs, not {CLAIM}")
            # Committed (a rollback would drop psycopg's prepared statements), then undone.
            with conn.transaction():
                conn.execute(UNCLAIM, {"ids": [job.id for job in got.claimed]})
            return elapsed

        return call

    def next_due(side: str) -> float:
        conn = conns[side]
        with conn.transaction():
            started = time.perf_counter()
            due = claims.next_due(conn, queues=["A"])
            elapsed = time.perf_counter() - started
        if due is None:
            raise RuntimeError("queue A has delayed jobs; next_due found none")
        return elapsed

    def each(operation: Callable[[str], float]) -> Callable[[tuple[str, ...]], dict[str, float]]:
        return lambda sides: {side: operation(side) for side in sides}

    def drain(side: str) -> float:
        conn = conns[side]
        with conn.transaction():
            conn.execute(DRAIN_SET, {"n": args.jobs})
        done = 0
        held: list[Held] = []
        started = time.perf_counter()
        while True:
            got = claims.exchange(
                conn, done=held, claim=CLAIM, lease=LEASE, worker="bench", queues=["A"]
            )
            done += len(got.done)
            if any(job.queue != "A" for job in got.claimed):
                raise RuntimeError("a worker of queue A claimed another queue's job")
            held = [job.held for job in got.claimed]
            if not held:
                break
        elapsed = time.perf_counter() - started
        if done != args.jobs + QUEUE_A_DUE:
            raise RuntimeError(f"drained {done} jobs, not {args.jobs + QUEUE_A_DUE}")
        tidy(conn)
        return done / elapsed

    def enqueue(side: str) -> float:
        conn = conns[side]
        jobs = [
            {"kind": "enqueued", "queue": "A", "payload": {"n": i}} for i in range(ENQUEUE_JOBS)
        ]
        started = time.perf_counter()
        with conn.transaction():
            enqueue_many(conn, jobs)
        elapsed = time.perf_counter() - started
        tidy(conn)
        return ENQUEUE_JOBS / elapsed

    pair = ("quiet", "backlog")
    figures = {
        "claim.queue": Figure("ms", pair, lambda s: alternating(claim(conns, queues=["A"]), s)),
        "claim.queue.unprepared": Figure(
            "ms", pair, lambda s: alternating(claim(unprepared, queues=["A"]), s)
        ),
        "drain.queue": Figure("jobs/s", pair, each(drain)),
        "next_due.queue": Figure("ms", pair, lambda s: alternating(next_due, s)),
        "claim.all": Figure("ms", pair, lambda s: alternating(claim(conns), s)),
        "claim.kind": Figure("ms", pair, lambda s: alternating(claim(conns, kinds=["a1"]), s)),
        "claim.queue_kind": Figure(
            "ms",
            ("quiet", "mixed"),
            lambda s: alternating(claim(conns, queues=["A"], kinds=["a1"]), s),
        ),
        "enqueue": Figure("jobs/s", ("quiet", "bare"), each(enqueue)),
    }
    targets = {"claim.queue": ("<=", 1.2), "drain.queue": (">=", 0.9)}

    values: dict[tuple[str, str], list[float]] = {}
    for round_no in range(args.rounds):
        for name in rotated(list(figures), round_no):
            figure = figures[name]
            got = figure.measure(tuple(rotated(list(figure.sides), round_no)))
            for side, value in got.items():
                values.setdefault((name, side), []).append(value)
        say(f"round {round_no + 1} of {args.rounds} done")

    print(f"# {args.rounds} rounds; backlog {args.backlog:,} jobs; claims of {CLAIM}")
    for name, figure in figures.items():
        for side in figure.sides:
            print(f"{name}.{side}: {summary(values[(name, side)], figure.unit)}")
    for name, figure in figures.items():
        base, other = figure.sides
        ratios = [o / b for o, b in zip(values[(name, other)], values[(name, base)], strict=True)]
        line = f"ratio {name} {other}/{base}: {summary(ratios, 'x', digits=2)}"
        if name in targets:
            sign, bound = targets[name]
            median = statistics.median(ratios)
            met = median <= bound if sign == "<=" else median >= bound
            line += f"  [target {sign} {bound}: {'met' if met else 'missed'}]"
        print(line)
    for conn in [*conns.values(), *unprepared.values()]:
        conn.close()


def connect(dsn: str, schema: str, *, prepared: bool = True) -> db.QueueConnection:
    """A connection set up as the worker's: its settings in every transaction."""
    conn = db.connect(dsn, schema=schema, settings=SESSION_SETTINGS)
    if not prepared:
        conn.prepare_threshold = None
    return conn


def setup(dsn: str, schema: str, backlog: int) -> db.QueueConnection:
    with db.connect(dsn, schema="public") as conn, conn.transaction():
        conn.execute(f'CREATE SCHEMA "{schema}"')
    conn = connect(dsn, schema)
    migrate.apply(conn, schema)
    started = time.perf_counter()
    with conn.transaction():
        conn.execute(DUE_SET)
        conn.execute(DELAYED_SET)
        if schema == "backlog":
            conn.execute(AHEAD, {"queue": "B", "kind": "b", "n": backlog})
        elif schema == "mixed":
            conn.execute(AHEAD, {"queue": "A", "kind": "other", "n": backlog})
        elif schema == "bare":
            conn.execute("DROP INDEX jobs_claim_queue_idx, jobs_claim_kind_idx")
    if schema == "backlog":
        say(f"{schema}: added {backlog:,} jobs in {time.perf_counter() - started:.1f} s")
        build_times(conn)
    vacuum(conn)
    return conn


def build_times(conn: db.QueueConnection) -> None:
    """What migration 0002 costs on this table: each index built again, timed."""
    for name in ("jobs_claim_queue_idx", "jobs_claim_kind_idx"):
        with conn.transaction():
            definition = conn.execute("SELECT pg_get_indexdef(%s::regclass)", (name,)).fetchone()
            assert definition is not None
            conn.execute(f"DROP INDEX {name}")
            started = time.perf_counter()
            conn.execute(definition[0])
        say(f"building {name} on this table: {time.perf_counter() - started:.1f} s")


def tidy(conn: db.QueueConnection) -> None:
    with conn.transaction():
        conn.execute(TIDY)
        row = conn.execute(DUE_LEFT).fetchone()
        if row is not None and row[0] == 0:
            conn.execute(DUE_SET)
    vacuum(conn)


def vacuum(conn: db.QueueConnection) -> None:
    # Outside a transaction (VACUUM cannot run in one), so the schema is
    # named: the connection's search_path is set per transaction.
    conn.execute(f'VACUUM ANALYZE "{conn.schema}".jobs')


def rotated(items: list[Any], round_no: int) -> list[Any]:
    shift = round_no % len(items)
    return items[shift:] + items[:shift]


if __name__ == "__main__":
    main()
