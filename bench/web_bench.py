"""How long each page of `pgqctl web` takes on a long history.

Serves a queue with `pgqctl web` (a process of its own, as a user starts
it) and times a GET of each page, first on a live set only (1,000 pending,
100 running, 100 failed jobs, and 3,600 jobs and attempts finished in the
last hour), then with --history done jobs (and an attempt each) finished
before the last hour, loaded first so that ids follow time as in a queue
that ran. Prints each page's median and slowest time, with and
without the history, and their ratio. The page's target: under 500 ms each.

    python bench/web_bench.py [--dsn DSN] [--history 1000000] [--rounds 10]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. It creates and drops a
database of its own. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psycopg
import throwaway_db
from shared_sql import HISTORY, LIVE_SET

RECENT = """
INSERT INTO jobs (queue, kind, payload, status, attempts, created_at, finished_at)
SELECT 'q' || i % 3, 'bench', '{"argv": ["true"]}',
       CASE WHEN i % 20 = 0 THEN 'failed' ELSE 'done' END, 1,
       now() - i * interval '1 second', now() - i * interval '1 second' + interval '10 ms'
FROM generate_series(1, 3600) AS i;
INSERT INTO attempts (job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at,
                      finished_at, recorded_by)
SELECT id, 1, 1, 'bench:1:0', CASE WHEN status = 'done' THEN 'done' ELSE 'failed' END,
       created_at, created_at, created_at, finished_at, 'worker'
FROM jobs WHERE finished_at > now() - interval '1 hour';
"""
OLD_ATTEMPTS = """
INSERT INTO attempts (job_id, claim, attempt, worker, outcome, due_at, claimed_at, started_at,
                      finished_at, recorded_by)
SELECT id, 1, 1, 'bench:1:0', 'done', created_at, created_at, created_at, finished_at, 'worker'
FROM jobs WHERE status = 'done'
"""
PAGES = [
    "/",
    "/jobs",
    "/jobs?status=failed",
    "/jobs?status=done",
    "/jobs?queue=q1&status=pending",
    "/jobs?since=1h",
    "/jobs?error=exit",
    "/jobs?error=matches-nothing",
    "/jobs/{old}",
    "/jobs/{failed}",
    "/jobs/{old}/attempts/1",
    "/workers",
    "/schedules",
    "/doctor",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--history", type=int, default=1_000_000, help="done jobs to add")
    parser.add_argument("--rounds", type=int, default=10, help="GETs of each page per side")
    args = parser.parse_args()
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    with (
        throwaway_db.server(admin_dsn) as server_dsn,
        throwaway_db.database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-web-bench-") as tmp,
    ):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(LIVE_SET)
            conn.execute(RECENT)
            conn.execute("VACUUM ANALYZE jobs, attempts")
        before = timed_pages(dsn, Path(tmp), args.rounds)
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            # The history goes in first and the live set after it, as ids
            # follow time in a real queue: the newest jobs have the highest ids.
            conn.execute("TRUNCATE jobs, attempts")
            conn.execute(HISTORY, {"n": args.history})
            conn.execute(OLD_ATTEMPTS)
            conn.execute(LIVE_SET)
            conn.execute(RECENT)
            conn.execute("VACUUM ANALYZE jobs, attempts")
            print(
                f"# {args.history:,} done jobs and attempts loaded in "
                f"{time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
        after = timed_pages(dsn, Path(tmp), args.rounds)
    print(f"# {args.rounds} GETs of each page per side; ms: median (slowest)")
    for page in PAGES:
        b, a = before[page], after[page]
        ratio = statistics.median(a) / statistics.median(b)
        print(
            f"{page}: live set {statistics.median(b):.1f} ({max(b):.1f}); "
            f"with {args.history:,} history {statistics.median(a):.1f} ({max(a):.1f}); "
            f"ratio {ratio:.2f}"
        )


def timed_pages(dsn: str, tmp: Path, rounds: int) -> dict[str, list[float]]:
    """Each page's GET times in ms, against a `pgqctl web` started for them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        old = conn.execute("SELECT min(id) FROM jobs WHERE status = 'done'").fetchone()
        failed = conn.execute("SELECT max(id) FROM jobs WHERE status = 'failed'").fetchone()
    ids = {"old": old[0] if old else 0, "failed": failed[0] if failed else 0}
    log = tmp / "web.log"
    with log.open("w") as err:
        web = subprocess.Popen(
            [sys.executable, "-m", "pgqctl", "web", "--dsn", dsn, "--port", "0"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            found = re.search(r"on (http://\S+?)/ ;", log.read_text())
            url = found.group(1) if found else None
            time.sleep(0.1)
        if url is None:
            raise RuntimeError(f"pgqctl web did not start: {log.read_text()}")
        times: dict[str, list[float]] = {page: [] for page in PAGES}
        for _ in range(rounds):
            for page in PAGES:
                started = time.perf_counter()
                with urllib.request.urlopen(url + page.format(**ids), timeout=60) as response:
                    response.read()
                times[page].append((time.perf_counter() - started) * 1000)
        return times
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(30)


if __name__ == "__main__":
    main()
