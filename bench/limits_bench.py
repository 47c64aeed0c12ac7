"""Flow limits against none: one burst worker draining `true` jobs, side by side.

One `pgqctl worker --burst --concurrency C` process drains N jobs
`{"argv": ["true"]}`, timed from its start to its exit, on four sides:

- `none`: no limit at all (the claims of before);
- `loose`: a concurrency limit on the jobs' kind far above C: every claim
  goes through pgqctl_claim_limited and every job takes and frees a seat,
  and the limit never binds;
- `bound`: a concurrency limit of C/2 on the kind: it binds;
- `half`: no limit, a worker of --concurrency C/2: what `bound` should
  reach (the limit's throughput).

Each round runs every side once, in an order that rotates from round to
round; each ratio is taken within a round, then summarised.

    python bench/limits_bench.py [--dsn DSN] [--jobs 5000] [--concurrency 4] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL; either
way a database of its own, dropped at the end. Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import throwaway_db
from report import say, summary
from sql_job_bench import Drain, check_all_done, drain_arguments, in_rounds, timed_worker
from worker_bench import load

FILL = """
INSERT INTO jobs (kind, payload)
SELECT 'k', '{"argv": ["true"]}'::jsonb FROM generate_series(1, %(n)s)
"""
SIDES = ["none", "loose", "bound", "half"]


def run_side(dsn: str, side: str, jobs: int, concurrency: int, log: Path) -> Drain:
    half = max(concurrency // 2, 1)
    limit = {"loose": 1000, "bound": half}.get(side)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        conn.execute("DELETE FROM limits")
        conn.execute(FILL, {"n": jobs})
        conn.execute("VACUUM ANALYZE jobs")
    pgqctl = [sys.executable, "-m", "pgqctl"]
    if limit is not None:
        set_limit = [*pgqctl, "limit", "set", "--dsn", dsn, "--kind", "k"]
        subprocess.run([*set_limit, "--concurrency", str(limit)], check=True, capture_output=True)
    workers = half if side == "half" else concurrency
    command = [*pgqctl, "worker", "--dsn", dsn, "--burst", "--concurrency", str(workers)]
    drain = timed_worker(command, log, None, side)
    check_all_done(dsn, side, jobs)
    return drain


def main() -> None:
    args = drain_arguments(__doc__ or "")
    with (
        throwaway_db.server(args.dsn) as server_dsn,
        throwaway_db.database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-limits-bench-") as tmp,
    ):
        log = Path(tmp) / "worker.log"
        for side in SIDES:  # warm up
            run_side(dsn, side, min(200, args.jobs), args.concurrency, log)
        load_before = load()
        runs = in_rounds(
            SIDES,
            args.rounds,
            lambda side: run_side(dsn, side, args.jobs, args.concurrency, log),
        )
        load_after = load()
    say("done")
    print(
        f"# {args.rounds} rounds; one `pgqctl worker --burst` draining {args.jobs:,} `true` "
        f"jobs per side, --concurrency {args.concurrency} (half: {max(args.concurrency // 2, 1)})"
    )
    print(f"# {os.cpu_count()} CPUs; load {load_before} before, {load_after} after")
    rates = {side: [args.jobs / d.seconds for d in runs[side]] for side in SIDES}
    for side in SIDES:
        print(f"drain.{side}: {summary(rates[side], 'jobs/s')}")
    for a, b, what in (
        ("loose", "none", "a limit defined, not binding, against none (target >= 0.91)"),
        ("bound", "half", "a binding limit against its throughput (no limit, half the slots)"),
    ):
        ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        print(f"ratio {a}/{b}, {what}: {summary(ratios, 'x')}")


if __name__ == "__main__":
    main()
