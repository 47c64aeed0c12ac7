"""What moving finished jobs into the history costs the workers' drain.

One schema holds --backlog done jobs finished an hour ago, still in jobs (an
installation upgraded from before the history, or a fleet that moves as fast
as jobs finish). Each round drains --drain no-op jobs through the worker's
exchange (as history_bench.drain does, SLOTS jobs an exchange) twice, in an
order that alternates from round to round:

- `moving`: while another process moves the backlog into the history at
  the pace of a worker's chore with a backlog (`history.move`: batches for
  a tenth of a second, then again a second later: worker/upkeep.py);
- `still`: with nothing moving.

It prints each drain's rate, the mover's rows a second, and the ratio of
the drain's times, moving over still (1.00: the move costs the drain
nothing; the issue's bound is 1.10). The backlog is put back between rounds
(untimed), so every round moves the same.

    python bench/archive_bench.py [--dsn DSN] [--rounds 6] [--drain 20000]
        [--backlog 200000]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. It creates and drops a
database of its own. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from typing import Any

import history_bench
import pgqctl_adapter
import throwaway_db
from report import say

from pgqctl import db, history, migrate

SCHEMA = "archive_bench"
BACKLOG = """
INSERT INTO jobs (queue, kind, payload, status, attempts, finished_at)
SELECT 'q' || i %% 3, 'old', '{"argv": ["true"]}', 'done', 1,
       now() - interval '1 hour' - i * interval '1 ms'
FROM generate_series(1, %(n)s) AS i
"""
# The history moved back into jobs between rounds, untimed.
PUT_BACK = """
WITH back AS (DELETE FROM jobs_history RETURNING *)
INSERT INTO jobs OVERRIDING SYSTEM VALUE SELECT * FROM back
"""


def mover(dsn: str, stop: Any, moved: Any, busy: Any) -> None:
    """A worker's move chore with a backlog: move for MOVE_BUDGET, rest a
    second (worker/upkeep.py ARCHIVE_AGAIN), until told to stop."""
    with db.connect(dsn, schema=SCHEMA) as conn:
        resume = None
        while not stop.is_set():
            began = time.perf_counter()
            done = history.move(conn, 0.0, resume=resume)
            busy.value += time.perf_counter() - began
            moved.value += done.jobs
            resume = done.resume if done.more else None
            stop.wait(1.0 if done.more else 30.0)


def drain_once(path: pgqctl_adapter.WorkerPath, conn: db.QueueConnection, jobs: int) -> float:
    """Seconds to claim and complete `jobs` jobs, SLOTS an exchange."""
    slots = history_bench.SLOTS
    history_bench.in_schema(conn, history_bench.DRAIN_JOBS, {"n": jobs})
    held: list[Any] = []
    started = time.perf_counter()
    for _ in range(jobs // slots):
        held = path.exchange(held)
        if len(held) != slots:
            raise RuntimeError(f"an exchange claimed {len(held)} jobs, not {slots}")
    path.claims.exchange(
        path.conn, done=[job.held for job in held], lease=path.LEASE_S, worker=path.worker
    )
    spent = time.perf_counter() - started
    history_bench.in_schema(conn, "DELETE FROM jobs WHERE kind = 'noop'")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--drain", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--backlog", type=int, default=200_000, help="done jobs to move")
    args = parser.parse_args()
    slots = history_bench.SLOTS
    jobs = max(slots, -(-args.drain // slots) * slots)
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    ctx = multiprocessing.get_context("spawn")
    with throwaway_db.server(admin_dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        with db.connect(dsn, schema="public") as conn:
            conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn = db.connect(dsn, schema=SCHEMA)
        migrate.apply(conn, SCHEMA)
        history_bench.in_schema(conn, BACKLOG, {"n": args.backlog})
        history_bench.vacuum(conn, SCHEMA, analyze=True)
        path = pgqctl_adapter.WorkerPath(dsn, slots=slots, schema=SCHEMA)
        ratios, rates = [], []
        for round_no in range(args.rounds):
            spent = {}
            for side in ("moving", "still") if round_no % 2 == 0 else ("still", "moving"):
                stop, moved, busy = ctx.Event(), ctx.Value("q", 0), ctx.Value("d", 0.0)
                proc = None
                if side == "moving":
                    proc = ctx.Process(target=mover, args=(dsn, stop, moved, busy))
                    proc.start()
                    time.sleep(1.5)  # its start-up and first move outside the timed drain
                    before = moved.value
                    began = time.perf_counter()
                spent[side] = drain_once(path, conn, jobs)
                if proc is not None:
                    rates.append((moved.value - before) / (time.perf_counter() - began))
                    stop.set()
                    proc.join()
                    history_bench.in_schema(conn, PUT_BACK)
                history_bench.vacuum(conn, SCHEMA)
            ratios.append(spent["moving"] / spent["still"])
            say(
                f"round {round_no + 1}: moving {jobs / spent['moving']:,.0f} jobs/s "
                f"(mover {rates[-1]:,.0f} rows/s), still {jobs / spent['still']:,.0f} jobs/s, "
                f"time ratio {ratios[-1]:.3f}"
            )
        path.conn.close()
        conn.close()
    print(
        f"drain time moving / still: {statistics.median(ratios):.3f} x "
        f"(median of {args.rounds} rounds; {min(ratios):.3f} .. {max(ratios):.3f}); "
        f"mover {statistics.median(rates):,.0f} rows/s during the drains"
    )


if __name__ == "__main__":
    main()
