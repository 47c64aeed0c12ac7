"""What the attempt history costs: one burst worker draining jobs with it
on, and the same worker with --no-history, side by side.

One `pgqctl worker --burst --concurrency C` process drains N jobs, timed
from its start to its exit, on each side:

- `history`: as shipped, every attempt recorded in the exchange's pipeline;
- `no_history`: `--no-history`, nothing recorded: the worker as it was
  before the history existed;

each with `true` jobs (no output), and with `output` jobs that write about
4 kB to stdout and as much to stderr (what the history keeps of a chatty
job; the default keeps 8 kB of each stream, so all of it). Each round runs
every side once, in an order that rotates; each ratio is taken within a
round. Per side, also the worker's CPU per job (process and children) and
the server's, and the transactions per job the database counted
(pg_stat_database.xact_commit): equal on both sides means the history adds
no transaction, its insert goes in the exchange's. Where the server loads
pg_stat_statements, also the statements per job and the history's inserts
per transaction: at most one, sent in the exchange's pipeline (no round
trip of its own). After the history
sides, the size of the attempts table (heap, indexes and TOAST) per
million attempts.

    python bench/attempts_bench.py [--dsn DSN] [--jobs 5000] [--concurrency 4] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end; either way a database of its
own, dropped at the end. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import throwaway_db
from report import summary
from sql_job_bench import Drain, drain_arguments, find_postmaster, in_rounds, timed_worker
from worker_bench import load

# A job writing about 4 kB to each stream (64 lines of 63 characters and a newline).
CHATTY = (
    'i=0; while [ $i -lt 64 ]; do echo "line $i of stdout, padded to be sixty-three characters'
    ' long."; echo "line $i of stderr, padded to be sixty-three characters long." >&2;'
    " i=$((i+1)); done"
)
PAYLOADS = {"true": '{"argv": ["true"]}', "output": None}
# Each side: its payload and the worker's extra options.
SIDES: dict[str, tuple[str, list[str]]] = {
    "true.history": ("true", []),
    "true.no_history": ("true", ["--no-history"]),
    "output.history": ("output", []),
    "output.no_history": ("output", ["--no-history"]),
}


@dataclass
class Run:
    drain: Drain  # how long, and the CPU the worker and the server used
    commits: int  # transactions the database committed during the drain
    statements: int | None  # statements the server ran for it (pg_stat_statements), if counted
    attempt_inserts: int | None  # of which the history's inserts
    attempts_bytes: int  # the attempts table's size after it
    attempts: int  # its rows


def prepare(dsn: str, jobs: int, payload: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, attempts")
        if payload == "output":
            conn.execute(
                "INSERT INTO jobs (kind, payload) SELECT 'output', "
                "jsonb_build_object('argv', jsonb_build_array('sh', '-c', %(script)s::text)) "
                "FROM generate_series(1, %(n)s)",
                {"script": CHATTY, "n": jobs},
            )
        else:
            conn.execute(
                "INSERT INTO jobs (kind, payload) SELECT 'true', %(p)s::jsonb "
                "FROM generate_series(1, %(n)s)",
                {"p": PAYLOADS["true"], "n": jobs},
            )
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE attempts")


def commits(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row else 0


def count_statements(dsn: str) -> bool:
    """Whether this server counts statements (pg_stat_statements preloaded):
    creates the extension in the bench's database if it can."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT count(*) FROM pg_stat_statements")
        except psycopg.Error:
            return False
    return True


def reset_statements(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")


def statements_run(dsn: str) -> tuple[int, int]:
    """Statements this database ran since the reset, and the attempts
    inserts among them (the bench's own reset and this read left out)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0), "
            "       coalesce(sum(calls) FILTER (WHERE query LIKE 'INSERT INTO attempts%%'), 0) "
            "FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "  AND query NOT LIKE '%%pg_stat_statements%%'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def run_worker(
    dsn: str,
    side: str,
    jobs: int,
    concurrency: int,
    log: Path,
    postmaster: int | None,
    statements: bool,
) -> Run:
    payload, options = SIDES[side]
    prepare(dsn, jobs, payload)
    command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn]
    command += ["--burst", "--concurrency", str(concurrency), "--no-schedules", *options]
    before = commits(dsn)
    if statements:
        reset_statements(dsn)
    drain = timed_worker(command, log, postmaster, side)
    time.sleep(0.5)  # the worker's backends flush their counts as they end
    # The reads themselves count one or two: nothing beside thousands of jobs.
    committed = commits(dsn) - before
    ran, inserts = statements_run(dsn) if statements else (None, None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM jobs"
        ).fetchone()
        size = conn.execute(
            "SELECT pg_total_relation_size('attempts'), (SELECT count(*) FROM attempts)"
        ).fetchone()
    if row != (jobs, jobs):
        raise RuntimeError(f"{side}: {row} of {jobs} jobs done")
    assert size is not None
    return Run(drain, committed, ran, inserts, int(size[0]), int(size[1]))


def main() -> None:
    args = drain_arguments(__doc__ or "")
    names = list(SIDES)
    with (
        throwaway_db.server(args.dsn) as server_dsn,
        throwaway_db.database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-attempts-bench-") as tmp,
    ):
        log = Path(tmp) / "worker.log"
        with psycopg.connect(dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        postmaster = find_postmaster(dsn)
        statements = count_statements(dsn)
        if not statements:
            print(
                "# statements not counted: this server does not load pg_stat_statements "
                "(shared_preload_libraries)",
                file=sys.stderr,
            )
        for side in names:  # warm up
            run_worker(
                dsn, side, min(200, args.jobs), args.concurrency, log, postmaster, statements
            )
        load_before = load()
        runs = in_rounds(
            names,
            args.rounds,
            lambda side: run_worker(
                dsn, side, args.jobs, args.concurrency, log, postmaster, statements
            ),
        )
        load_after = load()
    print(
        f"# {args.rounds} rounds; one `pgqctl worker --burst --concurrency {args.concurrency}` "
        f"draining {args.jobs:,} jobs per side, timed from start to exit"
    )
    print(
        f"# PostgreSQL {version[0] if version else '?'}; {os.cpu_count()} CPUs; "
        f"load {load_before} before, {load_after} after (1, 5, 15 min)"
    )
    for side in names:
        drains = [r.drain for r in runs[side]]
        print(f"drain.{side}: {summary([args.jobs / d.seconds for d in drains], 'jobs/s')}")
        cpu = [d.worker_cpu / args.jobs * 1e6 for d in drains]
        print(f"cpu_worker.{side}: {summary(cpu, 'us/job')}")
        server = [d.server_cpu / args.jobs * 1e6 for d in drains if d.server_cpu is not None]
        if len(server) == len(drains):
            print(f"cpu_server.{side}: {summary(server, 'us/job')}")
        commits_per_job = [r.commits / args.jobs for r in runs[side]]
        print(f"commits_per_job.{side}: {summary(commits_per_job, '')}")
        counted = [r for r in runs[side] if r.statements is not None]
        if counted:
            per_job = [(r.statements or 0) / args.jobs for r in counted]
            print(f"statements_per_job.{side}: {summary(per_job, '')}")
            # At most one per transaction: the history rides in the exchange's.
            inserts = [(r.attempt_inserts or 0) / r.commits for r in counted]
            print(f"attempt_inserts_per_commit.{side}: {summary(inserts, '')}")
    for jobs in ("true", "output"):
        on = [r.drain for r in runs[f"{jobs}.history"]]
        off = [r.drain for r in runs[f"{jobs}.no_history"]]
        rate = [b.seconds / a.seconds for a, b in zip(on, off, strict=True)]
        print(f"ratio drain {jobs} history/no_history (rate): {summary(rate, 'x')}")
        both = [
            (a.worker_cpu + a.server_cpu) / (b.worker_cpu + b.server_cpu)
            for a, b in zip(on, off, strict=True)
            if a.server_cpu is not None and b.server_cpu is not None
        ]
        if len(both) == len(on):
            print(f"ratio cpu worker+server {jobs} history/no_history: {summary(both, 'x')}")
        kept = [r for r in runs[f"{jobs}.history"] if r.attempts]
        per_million = [r.attempts_bytes / r.attempts * 1e6 / 2**20 for r in kept]
        print(f"attempts_table.{jobs}: {summary(per_million, 'MB per million attempts')}")


if __name__ == "__main__":
    main()
