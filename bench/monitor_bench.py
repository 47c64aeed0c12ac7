"""Do `check` and `metrics` stay cheap on a long history?

Times the library calls behind `check` (its defaults, and every threshold at
once) and `metrics`, on the live set of history_bench.py (1,000 pending, 100
running of which 50 expired, 100 failed), first with no finished history,
then with --history done rows added (finished 30 days ago), and counts the
rows each call reads from `jobs` as the server's statistics count them
(pg_stat_user_tables: seq_tup_read + idx_tup_fetch) and the table and index
blocks it touches (pg_statio_user_tables). Prints each figure and the ratio
with/without history (target: <= 2).

    python bench/monitor_bench.py [--dsn DSN] [--history 1000000] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own. It creates and drops a database of its own. Not a
test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
import throwaway_db
from history_bench import measure
from shared_sql import HISTORY, LIVE_SET

from pgqctl import db, monitor

EVERY_THRESHOLD = {
    "max_pending_age": 300.0,
    "max_pending": 10_000,
    "max_failed": 0,
    "max_expired_leases": 0,
    "max_running_age": 3600.0,
    "stalled": 600.0,
}
READ = """
SELECT t.seq_tup_read + coalesce(t.idx_tup_fetch, 0) AS rows,
       s.heap_blks_read + s.heap_blks_hit
       + coalesce(s.idx_blks_read, 0) + coalesce(s.idx_blks_hit, 0) AS blocks
FROM pg_stat_user_tables AS t
JOIN pg_statio_user_tables AS s USING (relid)
WHERE t.relname = 'jobs' AND t.schemaname = 'public'
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--history", type=int, default=1_000_000, help="done rows to add")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per operation per round")
    args = parser.parse_args()
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    with throwaway_db.server(admin_dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        run(dsn, args.history, args.rounds, args.calls)


def operations_on(conn: Any) -> dict[str, Callable[[], Any]]:
    defaults = monitor.applied({})
    return {
        "check (defaults)": lambda: monitor.check(conn, defaults),
        "check (every threshold)": lambda: monitor.check(conn, EVERY_THRESHOLD),
        "metrics": lambda: monitor.metrics_snapshot(conn),
    }


def reads(conn: Any, observer: psycopg.Connection[Any], op: Callable[[], Any]) -> tuple[int, int]:
    """Rows and blocks of `jobs` one call reads, from the statistics' deltas."""

    def counters() -> tuple[int, int]:
        # The measured backend sends its counts when it goes idle, once asked.
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.05)
        row = observer.execute(READ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    before = counters()
    op()
    after = counters()
    return after[0] - before[0], after[1] - before[1]


def run(dsn: str, history: int, rounds: int, calls: int) -> None:
    conn = db.connect(dsn, schema="public")
    # One execution per statement, as in one CLI invocation: never prepared.
    conn.prepare_threshold = None
    observer = psycopg.connect(dsn, autocommit=True)
    conn.execute(LIVE_SET)
    operations = operations_on(conn)

    conn.execute("VACUUM ANALYZE jobs")
    before = measure(operations, rounds, calls)
    read_before = {name: reads(conn, observer, op) for name, op in operations.items()}
    started = time.perf_counter()
    conn.execute(HISTORY, {"n": history})
    conn.execute("VACUUM ANALYZE jobs")
    print(f"# added {history:,} done rows in {time.perf_counter() - started:.1f} s")
    after = measure(operations, rounds, calls)
    read_after = {name: reads(conn, observer, op) for name, op in operations.items()}

    print(f"# medians of {rounds} rounds x {calls} calls; ratio = with / without history")
    for name in operations:
        (rows0, blocks0), (rows1, blocks1) = read_before[name], read_after[name]
        print(
            f"{name} (no history): {before[name] * 1000:.3f} ms, {rows0:,} rows, {blocks0:,} blocks"
        )
        print(
            f"{name} ({history:,} done): {after[name] * 1000:.3f} ms, "
            f"{rows1:,} rows, {blocks1:,} blocks"
        )
        print(
            f"{name} ratio: time {after[name] / before[name]:.2f}, "
            f"rows {rows1 / max(rows0, 1):.2f}, blocks {blocks1 / max(blocks0, 1):.2f}"
        )
    observer.close()
    conn.close()


if __name__ == "__main__":
    main()
