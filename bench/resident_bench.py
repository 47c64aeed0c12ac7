"""Resident handlers against a process per job, and against no process at all.

One `pgqctl worker --burst --concurrency C` process drains N jobs of a kind
whose handler is a Python program that does nothing, timed from its start
to its exit, on three sides:

- `per_job`: `--handler 'k=python3 handler.py'`: a Python process per job,
  which reads the payload from stdin and exits 0;
- `resident`: `--serve 'k=python3 resident.py'`: one Python process per slot,
  kept running, which answers each job's line with a result line;
- `no_child`: `--sql 'k=SELECT $1::jsonb IS NOT NULL'`: the worker claims and
  completes each job with a statement and starts no process: the worker's
  own cost of a job, the most a handler could reach.

With --imports, the handler imports those modules as it starts (a script's
usual start: `--imports asyncio,decimal,email.mime.multipart,http.client,logging`),
on both sides. CPU per job counts the worker and every process it ran. Each round runs
every side once, in an order that rotates from round to round; each ratio
is taken within a round, then summarised.

    python bench/resident_bench.py [--dsn DSN] [--jobs 2000] [--concurrency 4] [--rounds 3]
                                   [--imports MODULE,...]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL; either
way a database of its own, dropped at the end. Not a test: nothing here
asserts a timing.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

import psycopg
import throwaway_db
from report import say, summary, verdict
from sql_job_bench import Drain, check_all_done, drain_arguments, in_rounds, timed_worker
from worker_bench import load

FILL = """
INSERT INTO jobs (kind, payload)
SELECT 'k', jsonb_build_object('n', i) FROM generate_series(1, %(n)s) AS i
"""
PER_JOB = "import sys\nsys.stdin.read()\n"
RESIDENT = """import json, sys
for line in sys.stdin:
    print(json.dumps({"id": json.loads(line)["id"], "status": "done"}), flush=True)
"""
SIDES = ["per_job", "resident", "no_child"]


def run_side(dsn: str, side: str, jobs: int, concurrency: int, tmp: Path) -> Drain:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, attempts")
        conn.execute(FILL, {"n": jobs})
        conn.execute("VACUUM ANALYZE jobs")
    handler = {
        "per_job": ["--handler", f"k={sys.executable} {tmp / 'per_job.py'}"],
        "resident": ["--serve", f"k={sys.executable} {tmp / 'resident.py'}"],
        "no_child": ["--sql", "k=SELECT $1::jsonb IS NOT NULL"],
    }[side]
    command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst"]
    command += ["--concurrency", str(concurrency), *handler]
    drain = timed_worker(command, tmp / "worker.log", None, side)
    check_all_done(dsn, side, jobs)
    return drain


def main() -> None:
    args = drain_arguments(__doc__ or "", more=[("--imports", "modules the handler imports")])
    imports = "".join(f"import {m}\n" for m in (args.imports or "").split(",") if m)
    with (
        throwaway_db.server(args.dsn) as server_dsn,
        throwaway_db.database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-resident-bench-") as tmp_name,
    ):
        tmp = Path(tmp_name)
        (tmp / "per_job.py").write_text(imports + PER_JOB)
        (tmp / "resident.py").write_text(imports + RESIDENT)
        for side in SIDES:  # warm up
            run_side(dsn, side, min(100, args.jobs), args.concurrency, tmp)
        load_before = load()
        runs = in_rounds(
            SIDES, args.rounds, lambda side: run_side(dsn, side, args.jobs, args.concurrency, tmp)
        )
        load_after = load()
    say("done")
    print(
        f"# {args.rounds} rounds; one `pgqctl worker --burst --concurrency {args.concurrency}` "
        f"draining {args.jobs:,} jobs of a Python handler that does nothing, per side; "
        f"it imports: {args.imports or 'nothing'}"
    )
    print(f"# {os.cpu_count()} CPUs; load {load_before} before, {load_after} after")
    rates = {side: [args.jobs / d.seconds for d in runs[side]] for side in SIDES}
    cpu = {side: [d.worker_cpu / args.jobs * 1e6 for d in runs[side]] for side in SIDES}
    for side in SIDES:
        print(f"{side}: {summary(rates[side], 'jobs/s')}; CPU per job {summary(cpu[side], 'us')}")
    for a, b, what, values, target in (
        ("resident", "per_job", "throughput", rates, 10.0),
        ("per_job", "resident", "CPU per job, per-job over resident", cpu, 10.0),
        ("resident", "no_child", "throughput against no child", rates, 0.7),
    ):
        ratios = [x / y for x, y in zip(values[a], values[b], strict=True)]
        judged = verdict(statistics.median(ratios), ">=", target)
        print(f"ratio {a}/{b}, {what}: {summary(ratios, 'x')}{judged}")


if __name__ == "__main__":
    main()
