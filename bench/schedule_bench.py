"""What schedules cost a worker: a drain with 100 schedules defined against none.

A real `pgqctl worker --queue A --concurrency 8 --max-jobs N --no-reap`
process drains N jobs of queue A that run `true`, timed from its start to its
exit, on three sides:

- `none`: no schedule;
- `minutely`: 100 schedules of `* * * * *` (a crontab's usual grain) into
  queue B, which this worker does not serve: the worker reads them, keeps
  them and looks for due ticks, and enqueues 100 jobs when a minute turns;
- `every_second`: 100 schedules ticking every second into queue B, the worst
  case: each second the worker works out 100 due ticks and enqueues them (100
  jobs inserted a second, and the wake-up their insert sends) while it runs
  jobs.

The sides take turns going first from round to round, on a database of
their own. Prints `name: median unit (min .. max)` over the rounds, then the
ratios (jobs/s with the schedules / jobs/s without; target >= 0.95 for
schedules defined, `minutely`; `every_second` is shown for what it is).

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
from report import say, summary

SCHEDULES = 100
FILL = """
INSERT INTO jobs (queue, kind, payload)
SELECT 'A', 'a', '{"argv": ["true"]}' FROM generate_series(1, %(n)s)
"""
DEFINE = """
INSERT INTO schedules (name, cron, every_seconds, kind, payload, queue)
SELECT 'tick-' || n, %(cron)s, %(every)s, 'b', '{"argv": ["true"]}', 'B'
FROM generate_series(1, %(n)s) AS n
"""
# Each side's schedules: (cron, every_seconds), or None for none.
SIDES = {"none": None, "minutely": ("* * * * *", None), "every_second": (None, 1)}
TIDY = "DELETE FROM jobs; DELETE FROM schedules"


def drain(dsn: str, jobs: int, side: str) -> tuple[float, int]:
    """Seconds for one worker to run `jobs` jobs with the schedules of
    `side`; and the ticks it enqueued meanwhile."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TIDY)
        conn.execute(FILL, {"n": jobs})
        timing = SIDES[side]
        if timing is not None:
            conn.execute(DEFINE, {"n": SCHEDULES, "cron": timing[0], "every": timing[1]})
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
    names = list(SIDES)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    ticks: dict[str, list[float]] = {name: [] for name in names[1:]}
    with throwaway_db.server(args.dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        subprocess.run(
            [sys.executable, "-m", "pgqctl", "migrate", "--dsn", dsn],
            check=True,
            stderr=subprocess.DEVNULL,
        )
        drain(dsn, 200, "every_second")  # warm up: caches, the page cache of the programs
        for round_no in range(args.rounds):
            order = names[round_no % len(names) :] + names[: round_no % len(names)]
            got = {}
            for name in order:
                seconds, ticked = drain(dsn, args.jobs, name)
                got[name] = args.jobs / seconds
                rates[name].append(got[name])
                if name in ticks:
                    ticks[name].append(float(ticked))
            for name in ratios:
                ratios[name].append(got[name] / got["none"])
            say(f"round {round_no + 1} of {args.rounds} done")
    print(f"# {args.rounds} rounds; one worker, --concurrency 8, {args.jobs:,} jobs of `true`")
    for name in names:
        print(f"drain.{name}: {summary(rates[name], 'jobs/s')}")
    for name in ticks:
        print(f"ticks enqueued meanwhile, {name}: {summary(ticks[name], 'jobs')}")
    for name, values in ratios.items():
        line = f"ratio drain {name}/none (rate): {summary(values, 'x', digits=3)}"
        if name == "minutely":
            met = statistics.median(values) >= 0.95
            line += f"  [target >= 0.95: {'met' if met else 'missed'}]"
        print(line)


if __name__ == "__main__":
    main()
