"""What the worker's heartbeat costs its claim-and-complete path.

The worker heartbeats in `workers` by pipelining one more statement
(worker_beat) with an exchange, at most every --heartbeat (10s by default),
so the exchanges between two heartbeats are exactly what they were before.
This drains --jobs no-op jobs through `claims.exchange` (report the last
batch done and claim the next 10, until the queue is empty: the drain
workload of bench/compare.py on one connection, set up as the worker's), in
three ways, within each round and in an order that rotates:

- none: no heartbeat at all (the exchange as it was before workers
  registered);
- worker: a heartbeat with the exchange whenever 10 s have passed since the
  last one, as the worker sends it;
- every: a heartbeat with every exchange, the upper bound (a worker with a
  --heartbeat shorter than its exchanges are apart).

Prints `name: median unit (min .. max)` over the rounds, then the ratios of
drain times against none (target for worker: <= 1.05), and of this
process's CPU time (the client's side of the exchanges, which the
machine's other tenants disturb less than wall time).

    python bench/heartbeat_bench.py [--dsn DSN] [--jobs 20000] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

import throwaway_db
from report import say, summary

from pgqctl import __version__, claims, db, registry
from pgqctl.jobs import Held
from pgqctl.worker import SESSION_SETTINGS

CLAIM = 10
LEASE = 300.0
HEARTBEAT = 10.0
WAYS = {"none": None, "worker": HEARTBEAT, "every": 0.0}
FILL = """
INSERT INTO jobs (kind, payload)
SELECT 'bench', '{"argv": ["true"]}' FROM generate_series(1, %(n)s)
"""
TIDY = "DELETE FROM jobs"
BEAT = registry.Beat(
    id=f"bench:{os.getpid()}",
    host="bench",
    pid=os.getpid(),
    version=__version__,
    queues=(),
    kinds=(),
    concurrency=CLAIM,
    heartbeat=HEARTBEAT,
    lease=LEASE,
)


def drain(conn: db.QueueConnection, jobs: int, every: float | None) -> tuple[float, float]:
    """Seconds to claim and complete `jobs` jobs, 10 at a time, with a
    heartbeat every `every` seconds (None: never), and the CPU seconds this
    process spent on it."""
    with conn.transaction():
        conn.execute(FILL, {"n": jobs})
    conn.execute("VACUUM ANALYZE jobs")
    done = 0
    held: list[Held] = []
    started = time.perf_counter()
    cpu = time.process_time()
    next_beat = started  # the first exchange registers, as the worker's does
    started_at = None
    while True:
        beat = None
        if every is not None and time.perf_counter() >= next_beat:
            beat = replace(BEAT, started_at=started_at, running=len(held), done=done)
            next_beat = time.perf_counter() + every
        got = claims.exchange(conn, done=held, claim=CLAIM, lease=LEASE, worker="bench", beat=beat)
        if got.beaten is not None:
            started_at = got.beaten.started_at
        done += len(got.done)
        held = [job.held for job in got.claimed]
        if not held:
            break
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    if done != jobs:
        raise RuntimeError(f"drained {done} jobs, not {jobs}")
    with conn.transaction():
        conn.execute(TIDY)
        conn.execute("DELETE FROM workers")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with throwaway_db.server(args.dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        conn = db.connect(dsn, schema="public", settings=SESSION_SETTINGS)
        # Warm up: caches, and psycopg prepares a statement on its sixth run.
        for every in WAYS.values():
            drain(conn, 500, every)
        times: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        names = list(WAYS)
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            got = {name: drain(conn, args.jobs, WAYS[name]) for name in order}
            for name in names:
                times.setdefault(name, []).append(got[name][0])
                cpus.setdefault(name, []).append(got[name][1])
            say(f"round {round_no + 1} of {args.rounds} done ({', '.join(order)})")
        conn.close()
    print(f"# {args.rounds} rounds; drains of {args.jobs:,} jobs, claims of {CLAIM}")
    for name in names:
        print(f"drain.{name}: {summary([args.jobs / t for t in times[name]], 'jobs/s')}")
    for name in names[1:]:
        ratios = [t / base for t, base in zip(times[name], times["none"], strict=True)]
        line = f"ratio drain.{name}/none (time): {summary(ratios, 'x', digits=3)}"
        if name == "worker":
            met = statistics.median(ratios) <= 1.05
            line += f"  [target <= 1.05: {'met' if met else 'missed'}]"
        print(line)
    for name in names[1:]:
        ratios = [t / base for t, base in zip(cpus[name], cpus["none"], strict=True)]
        print(f"ratio drain.{name}/none (client CPU): {summary(ratios, 'x', digits=3)}")


if __name__ == "__main__":
    main()
