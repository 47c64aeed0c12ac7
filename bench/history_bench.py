"""Do the operator commands stay cheap on a long history?

Times the library calls behind `leases`, `reap --dry-run`, `reap`,
`requeue --dry-run --failed`, `list --status failed`, `stats`, and a worker's
claim, on a live set of 1,000 pending, 100 running (50 of them expired) and
100 failed jobs: first with no finished rows, then with --history done rows
added. Prints each median and the ratio with/without history (target: <= 2).

    python bench/history_bench.py [--dsn DSN] [--history 1000000] [--rounds 5]

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
from typing import Any

import throwaway_db
from shared_sql import HISTORY, LIVE_SET, REEXPIRE

from pgqctl import admin, db, leases

EXPIRED = 50
CLAIM = """
SELECT id FROM jobs
WHERE status = 'pending' AND run_at <= now()
ORDER BY priority DESC, run_at, id
LIMIT 10
FOR UPDATE SKIP LOCKED
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


def run(dsn: str, history: int, rounds: int, calls: int) -> None:
    conn = db.connect(dsn, schema="public")
    # One execution per statement, as in one CLI invocation: never prepared.
    conn.prepare_threshold = None
    conn.execute(LIVE_SET)
    expired_ids = [lease.job.id for lease in leases.leases(conn, expired_only=True)]
    assert len(expired_ids) == EXPIRED, expired_ids
    operations = operations_on(conn, expired_ids)

    conn.execute("VACUUM ANALYZE jobs")
    before = measure(operations, rounds, calls)
    started = time.perf_counter()
    conn.execute(HISTORY, {"n": history})
    conn.execute("VACUUM ANALYZE jobs")
    print(f"# added {history:,} done rows in {time.perf_counter() - started:.1f} s")
    after = measure(operations, rounds, calls)

    print(f"# medians of {rounds} rounds x {calls} calls; ratio = with / without history")
    for name in operations:
        print(f"{name} (no history): {before[name] * 1000:.3f} ms")
        print(f"{name} ({history:,} done): {after[name] * 1000:.3f} ms")
        print(f"{name} ratio: {after[name] / before[name]:.2f}")
    purge_throughput(conn, history)
    conn.close()


def operations_on(conn: Any, expired_ids: list[int]) -> dict[str, Callable[[], Any]]:
    def reap() -> Any:
        # Only the reap itself is timed (see `measure`); the reset is not.
        return leases.reap(conn)

    def claim() -> Any:
        with conn.transaction(force_rollback=True):
            return conn.execute(CLAIM).fetchall()

    reap.setup = lambda: conn.execute(REEXPIRE, {"ids": expired_ids})  # type: ignore[attr-defined]
    return {
        "leases": lambda: leases.leases(conn),
        "reap --dry-run": lambda: leases.reap_preview(conn),
        f"reap ({EXPIRED} expired)": reap,
        "requeue --dry-run --failed": lambda: admin.requeue(conn, admin.Selection(), dry_run=True),
        "list --status failed": lambda: admin.list_jobs(conn, status="failed"),
        "stats": lambda: admin.stats(conn),
        "claim (10, rolled back)": claim,
    }


def measure(operations: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    per_round: dict[str, list[float]] = {name: [] for name in operations}
    for _ in range(rounds):
        for name, op in operations.items():
            times = []
            for _ in range(calls):
                setup = getattr(op, "setup", None)
                if setup:
                    setup()
                started = time.perf_counter()
                op()
                times.append(time.perf_counter() - started)
            per_round[name].append(statistics.median(times))
    return {name: statistics.median(values) for name, values in per_round.items()}


def purge_throughput(conn: Any, history: int) -> None:
    plan = admin.purge_plan(conn, ["done"])
    started = time.perf_counter()
    deleted = admin.purge(conn, plan)
    elapsed = time.perf_counter() - started
    print(f"purge ({deleted:,} done rows, batches of 10,000): {elapsed:.1f} s")
    print(f"purge rate: {deleted / elapsed:,.0f} rows/s")


if __name__ == "__main__":
    main()
