"""How fast pgqctl enqueues, against one INSERT per transaction, in one run.

    python bench/enqueue_bench.py [--dsn DSN] [--jobs 100000] [--rounds 3]

Measures, each round on an emptied table:

  a. `pgqctl enqueue --file F --format json` as a subprocess, process start
     included, loading a JSON-lines file of --jobs jobs;
  b. the Python API, `pgqctl.enqueue_many(conn, jobs)`, for --jobs jobs;
  c. one plain INSERT per transaction (autocommit) for --single-jobs jobs,
     half before a and half after b.

Prints `name: value unit` lines: each rate's median, min and max over the
rounds, and the ratios a/c and b/c (computed within each round, then
summarised). The machines are noisy: compare within a run, by ratio.

--dsn names a server where the bench may create and drop a database of its
own; the default is PGQCTL_TEST_DSN, else a throwaway embedded PostgreSQL
(durable settings, like a real server) in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import psycopg
import throwaway_db

import pgqctl


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQCTL_TEST_DSN"))
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--single-jobs", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with (
        throwaway_db.server(args.dsn) as server,
        throwaway_db.database(server) as dsn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        path = Path(tmp) / "jobs.jsonl"
        records = _records(args.jobs)
        with path.open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _describe(conn, args)
            rates: dict[str, list[float]] = {"a": [], "b": [], "c": []}
            first_half = args.single_jobs // 2
            second_half = args.single_jobs - first_half
            for round_number in range(1, args.rounds + 1):
                # c runs half before a and half after b, so that a change of
                # load during the round weighs on both sides of the ratios.
                c_time = _seconds(first_half, conn, lambda: _single_inserts(conn, first_half))
                a = args.jobs / _seconds(args.jobs, conn, lambda: _cli_file(dsn, path))
                b = args.jobs / _seconds(
                    args.jobs, conn, lambda: pgqctl.enqueue_many(conn, records)
                )
                c_time += _seconds(second_half, conn, lambda: _single_inserts(conn, second_half))
                c = args.single_jobs / c_time
                for key, value in zip("abc", (a, b, c), strict=True):
                    rates[key].append(value)
                print(
                    f"# round {round_number}: a {a:,.0f}  b {b:,.0f}  c {c:,.0f} jobs/s",
                    file=sys.stderr,
                )
    _summary("a_cli_file_copy", rates["a"], "jobs/s")
    _summary("b_api_enqueue_many", rates["b"], "jobs/s")
    _summary("c_insert_per_transaction", rates["c"], "jobs/s")
    _summary("ratio_a_over_c", [a / c for a, c in zip(rates["a"], rates["c"], strict=True)], "x")
    _summary("ratio_b_over_c", [b / c for b, c in zip(rates["b"], rates["c"], strict=True)], "x")
    return 0


def _records(count: int) -> list[dict[str, Any]]:
    return [{"kind": "echo", "payload": {"argv": ["echo", f"job {i}"]}} for i in range(count)]


def _seconds(expected: int, conn: psycopg.Connection[Any], run: Callable[[], object]) -> float:
    """How long one run takes on an emptied table; its jobs are checked by counting."""
    conn.execute("TRUNCATE jobs")
    # So that no run pays for the previous run's dirty pages (needs superuser).
    with suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("CHECKPOINT")
    start = time.perf_counter()
    run()
    elapsed = time.perf_counter() - start
    row = conn.execute("SELECT count(*) FROM jobs").fetchone()
    if not row or row[0] != expected:
        raise SystemExit(f"expected {expected} jobs, found {row[0] if row else None}")
    return elapsed


def _cli_file(dsn: str, path: Path) -> None:
    command = [sys.executable, "-m", "pgqctl", "enqueue", "--file", str(path), "--format", "json"]
    subprocess.run(
        [*command, "--dsn", dsn], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _single_inserts(conn: psycopg.Connection[Any], count: int) -> None:
    payload = json.dumps({"argv": ["echo", "job"]})
    for _ in range(count):
        conn.execute("INSERT INTO jobs (kind, payload) VALUES (%s, %s::jsonb)", ("echo", payload))


def _describe(conn: psycopg.Connection[Any], args: argparse.Namespace) -> None:
    settings = conn.execute(
        "SELECT current_setting('server_version'), current_setting('fsync'),"
        " current_setting('synchronous_commit')"
    ).fetchone()
    assert settings is not None
    version, fsync, sync_commit = settings
    print(
        f"# PostgreSQL {version} (fsync {fsync}, synchronous_commit {sync_commit}); "
        f"{args.jobs:,} jobs for a and b, {args.single_jobs:,} for c; {args.rounds} rounds; "
        f"{os.cpu_count()} CPUs",
        file=sys.stderr,
    )


def _summary(name: str, values: list[float], unit: str) -> None:
    digits = 1 if unit == "x" else 0
    for stat, value in (
        ("median", statistics.median(values)),
        ("min", min(values)),
        ("max", max(values)),
    ):
        print(f"{name}_{stat}: {value:.{digits}f} {unit}")


if __name__ == "__main__":
    sys.exit(main())
