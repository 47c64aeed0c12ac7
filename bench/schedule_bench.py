"""What ticking schedules costs a worker: a drain with 100 schedules defined
against none.

A real `pgqctl worker --queue A --concurrency 8 --max-jobs N --no-reap`
process drains N jobs of queue A that run `true`, timed from its start to its
exit, once with no schedule and once with 100 schedules that tick every
second into queue B (which this worker does not serve): the worst case for
the worker's loop, which then reads the schedules, works out 100 due ticks
and enqueues them in its one statement a second, while it runs jobs. The
sides alternate which goes first from round to round, on a database of
their own.

Prints `name: median unit (min .. max)` over the rounds, then the ratio
(jobs/s with the schedules / jobs/s without; target >= 0.95).

    python bench/schedule_bench.py [--dsn DSN] [--jobs 3000] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import psycopg
import throwaway_db

SCHEDULES = 100
FILL = """
INSERT INTO jobs (queue, kind, payload)
SELECT 'A', 'a', '{"argv": ["true"]}' FROM generate_series(1, %(n)s)
"""
DEFINE = """
INSERT INTO schedules (name, every_seconds, kind, payload, queue)
SELECT 'tick-' || n, 1, 'b', '{"argv": ["true"]}', 'B' FROM generate_series(1, %(n)s) AS n
"""
TIDY = "DELETE FROM jobs; DELETE FROM schedules"


def drain(dsn: str, jobs: int, schedules: int) -> tuple[float, int]:
    """Seconds for one worker to run `jobs` jobs with `schedules` schedules
    ticking every second; and the ticks it enqueued meanwhile."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TIDY)
        conn.execute(FILL, {"n": jobs})
        if schedules:
            conn.execute(DEFINE, {"n": schedules})
        conn.execute("VACUUM ANALYZE jobs")
    command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--queue", "A"]
    command += ["--concurrency", "8", "--max-jobs", str(jobs), "--no-reap"]
    started = time.perf_counter()
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL, env=os.environ)
    elapsed = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM jobs WHERE queue = 'A' AND status <> 'done'")
        if (left.fetchone() or [1])[0]:
            raise RuntimeError("the worker left jobs of queue A undone")
        ticked = conn.execute("SELECT count(*) FROM jobs WHERE tick IS NOT NULL").fetchone()
    return elapsed, int((ticked or [0])[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--jobs", type=int, default=3_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {0: [], SCHEDULES: []}
    ratios: list[float] = []
    ticks: list[int] = []
    with throwaway_db.server(args.dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        subprocess.run(
            [sys.executable, "-m", "pgqctl", "migrate", "--dsn", dsn],
            check=True,
            stderr=subprocess.DEVNULL,
        )
        drain(dsn, 200, SCHEDULES)  # warm up: caches, the page cache of the programs
        for round_no in range(args.rounds):
            got = {}
            for n in (0, SCHEDULES) if round_no % 2 == 0 else (SCHEDULES, 0):
                seconds, ticked = drain(dsn, args.jobs, n)
                got[n] = args.jobs / seconds
                rates[n].append(got[n])
                if n:
                    ticks.append(ticked)
            ratios.append(got[SCHEDULES] / got[0])
            say(f"round {round_no + 1} of {args.rounds} done")
    print(f"# {args.rounds} rounds; one worker, --concurrency 8, {args.jobs:,} jobs of `true`")
    print(f"drain.no_schedules: {summary(rates[0], 'jobs/s')}")
    print(f"drain.{SCHEDULES}_schedules: {summary(rates[SCHEDULES], 'jobs/s')}")
    print(f"ticks enqueued meanwhile: {summary([float(t) for t in ticks], 'jobs')}")
    met = statistics.median(ratios) >= 0.95
    print(
        f"ratio drain {SCHEDULES}_schedules/no_schedules (rate): "
        f"{summary(ratios, 'x', digits=3)}  [target >= 0.95: {'met' if met else 'missed'}]"
    )


def summary(values: list[float], unit: str, digits: int | None = None) -> str:
    med, low, high = statistics.median(values), min(values), max(values)
    if digits is None:
        digits = 0 if med >= 100 else 3 if med < 1 else 2
    return f"{med:.{digits}f} {unit} ({low:.{digits}f} .. {high:.{digits}f})"


def say(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
