"""What an index on jobs costs the workers: the drain with and without it.

Two schemas of one database hold the same live set (bench/shared_sql.py's:
1,000 pending, 100 running, 100 failed); one of them lacks the index named
by --index (dropped after migrating). Each round drains --drain no-op jobs
through the worker's exchange on each side, the sides taking turns
exchange by exchange (history_bench.drain), and prints each side's rate
and the ratio of their times, with the index over without. The median
ratio over the rounds is the index's cost to the drain (1.00: none).

    python bench/index_cost_bench.py [--dsn DSN] [--index jobs_created_brin]
        [--rounds 8] [--drain 5000]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end. It creates and drops a
database of its own. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import statistics

import history_bench
import throwaway_db
from psycopg import sql
from report import say
from shared_sql import LIVE_SET

from pgqctl import db, migrate

SIDES = {"with": "index_kept", "without": "index_dropped"}  # label: schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--index", default="jobs_created_brin", help="the index to weigh")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--drain", type=int, default=5_000, help="jobs per drain")
    args = parser.parse_args()
    slots = history_bench.SLOTS
    jobs = max(slots, -(-args.drain // slots) * slots)
    admin_dsn = args.dsn or os.environ.get("PGQCTL_TEST_DSN")
    with throwaway_db.server(admin_dsn) as server_dsn, throwaway_db.database(server_dsn) as dsn:
        for label, schema in SIDES.items():
            with db.connect(dsn, schema="public") as conn:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            with db.connect(dsn, schema=schema) as conn:
                migrate.apply(conn, schema)
                history_bench.in_schema(conn, LIVE_SET)
                if label == "without":
                    drop = sql.SQL("DROP INDEX {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(args.index)
                    )
                    conn.execute(drop)
                history_bench.vacuum(conn, schema, analyze=True)
        sides = {label: history_bench.open_side(dsn, label, s) for label, s in SIDES.items()}
        ratios = []
        for round_no in range(args.rounds):
            spent = history_bench.drain(sides, jobs, round_no)
            ratios.append(spent["with"] / spent["without"])
            say(
                f"round {round_no + 1}: with {args.index} {jobs / spent['with']:,.0f} jobs/s, "
                f"without {jobs / spent['without']:,.0f} jobs/s, time ratio {ratios[-1]:.3f}"
            )
        for side in sides.values():
            side.conn.close()
            side.worker.conn.close()
    print(
        f"drain time with {args.index} / without: {statistics.median(ratios):.3f} x "
        f"(median of {args.rounds} rounds; {min(ratios):.3f} .. {max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
