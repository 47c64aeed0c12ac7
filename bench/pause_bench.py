"""What skipping paused queues costs the worker's claim while no queue is paused.

The claims read the pauses in effect (`queue <> ALL(ARRAY(TABLE
paused_queues_now))`, see worker_claim_all in sql/queries/claims.sql). This runs
the worker's claim-and-complete path (`claims.exchange`: report the last
batch done and claim the next 10, until the queue is empty) over --jobs
jobs, once with the statement the worker sends and once with the same
statement without the paused-queues check, for each shape of worker (no
--queue, --queue, --kind), on a database of its own and one connection set
up as the worker's (generic plans). The sides alternate which goes first
from round to round. A last figure drains with a pause of another queue in
effect, against no pause.

Prints `name: median unit (min .. max)` over the rounds, then the ratios
(time with the check / time without it; target <= 1.1).

    python bench/pause_bench.py [--dsn DSN] [--jobs 5000] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import throwaway_db
from report import say, summary

from pgqctl import claims, db
from pgqctl.jobs import Held
from pgqctl.worker import SESSION_SETTINGS

CLAIM = 10
LEASE = 300.0
# The check as each claim spells it (the walks, and a --queue worker's list).
CHECKS = (
    "\n          AND queue || '' <> ALL(ARRAY(SELECT queue FROM paused_queues_now))",
    "\n    WHERE q <> ALL(ARRAY(SELECT queue FROM paused_queues_now))",
)
SHAPES = {"all": {}, "queue": {"queues": ["A"]}, "kind": {"kinds": ["a"]}}
FILL = """
INSERT INTO jobs (queue, kind, payload)
SELECT 'A', 'a', '{"argv": ["true"]}' FROM generate_series(1, %(n)s)
"""
TIDY = "DELETE FROM jobs"


def without_check(queues: Any = (), kinds: Any = ()) -> str:
    """The worker's statement for these filters with the paused-queues check cut out."""
    text = _sent(queues, kinds)
    cut = text
    for check in CHECKS:
        cut = cut.replace(check, "")
    if cut == text:
        raise RuntimeError("the claim has no paused-queues check to cut out: update CHECKS")
    return cut


_sent = claims.exchange_statement


@contextmanager
def statement(checked: bool) -> Iterator[None]:
    """Drain with the statement the worker sends, or with the check cut out."""
    if checked:
        yield
        return
    claims.exchange_statement = without_check  # type: ignore[assignment]
    try:
        yield
    finally:
        claims.exchange_statement = _sent


def drain(conn: db.QueueConnection, jobs: int, filters: dict[str, Any]) -> float:
    """Seconds to claim and complete `jobs` jobs, 10 at a time."""
    with conn.transaction():
        conn.execute(FILL, {"n": jobs})
    conn.execute("VACUUM ANALYZE jobs")
    done = 0
    held: list[Held] = []
    started = time.perf_counter()
    while True:
        got = claims.exchange(conn, done=held, claim=CLAIM, lease=LEASE, worker="bench", **filters)
        done += len(got.done)
        held = [job.held for job in got.claimed]
        if not held:
            break
    elapsed = time.perf_counter() - started
    if done != jobs:
        raise RuntimeError(f"drained {done} jobs, not {jobs}")
    with conn.transaction():
        conn.execute(TIDY)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with throwaway_db.server(args.dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        conn = db.connect(dsn, schema="public", settings=SESSION_SETTINGS)
        # Warm up: caches, and psycopg prepares a statement on its sixth run.
        for shape in SHAPES.values():
            for checked in (True, False):
                with statement(checked):
                    drain(conn, 200, shape)
        times: dict[str, list[float]] = {}
        ratios: dict[str, list[float]] = {}
        for round_no in range(args.rounds):
            for name, shape in SHAPES.items():
                got = {}
                for checked in (True, False) if round_no % 2 == 0 else (False, True):
                    with statement(checked):
                        got[checked] = drain(conn, args.jobs, shape)
                for checked, seconds in got.items():
                    side = "checked" if checked else "unchecked"
                    times.setdefault(f"drain.{name}.{side}", []).append(args.jobs / seconds)
                ratios.setdefault(f"drain.{name} checked/unchecked", []).append(
                    got[True] / got[False]
                )
            # A pause of another queue in effect, against none (both checked).
            got = {}
            for paused in (True, False) if round_no % 2 == 0 else (False, True):
                with conn.transaction():
                    if paused:
                        conn.execute("INSERT INTO paused_queues (queue) VALUES ('elsewhere')")
                    else:
                        conn.execute("DELETE FROM paused_queues")
                got[paused] = drain(conn, args.jobs, {})
            with conn.transaction():
                conn.execute("DELETE FROM paused_queues")
            ratios.setdefault("drain.all other_paused/none_paused", []).append(
                got[True] / got[False]
            )
            say(f"round {round_no + 1} of {args.rounds} done")
        conn.close()
    print(f"# {args.rounds} rounds; drains of {args.jobs:,} jobs, claims of {CLAIM}")
    for name, values in times.items():
        print(f"{name}: {summary(values, 'jobs/s')}")
    for name, values in ratios.items():
        line = f"ratio {name} (time): {summary(values, 'x', digits=3)}"
        if "unchecked" in name:
            met = statistics.median(values) <= 1.1
            line += f"  [target <= 1.1: {'met' if met else 'missed'}]"
        print(line)


if __name__ == "__main__":
    main()
