"""How fast pgqctl enqueues, against a raw COPY and one INSERT per transaction, in one run.

    python bench/enqueue_bench.py [--dsn DSN] [--jobs 100000] [--rounds 3]

Measures, each round on an emptied table:

  a. `pgqctl enqueue --file F --format json` as a subprocess, process start
     included, loading a JSON-lines file of --jobs jobs;
  b. the Python API, `pgqctl.enqueue_many(conn, jobs)` in autocommit mode,
     for --jobs jobs, as a role that may draw from the id sequence (COPY
     straight into jobs);
  s. the same as a role without that privilege (rows staged in a temporary
     table; the application role of docs/operating.md, Roles), when the
     bench may create roles;
  r. the database's own limit: a raw psycopg `COPY jobs (kind, payload)`
     of the same jobs, each payload made JSON text in the timed part,
     nothing checked and nothing returned;
  c. one plain INSERT per transaction (autocommit) for --single-jobs jobs,
     half before a and half after the others.

Prints `name: value unit` lines: each rate's median, min and max over the
rounds, and the ratios (computed within each round, then summarised). For
b, s and r it also prints the CPU seconds the client and the server's
backend spent on the load (the backend's read from /proc, when the server
runs on this machine): where the time goes, steadier than rates on a busy
machine. The machines are noisy: compare within a run, by ratio.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import throwaway_db
from psycopg import conninfo, sql

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
        _role_without_sequence(dsn) as staged_dsn,
    ):
        path = Path(tmp) / "jobs.jsonl"
        records = _records(args.jobs)
        with path.open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _describe(conn, args)
            rates: dict[str, list[float]] = {k: [] for k in "absrc"}
            cpu: dict[str, list[tuple[float, float | None]]] = {k: [] for k in "bsr"}
            first_half = args.single_jobs // 2
            second_half = args.single_jobs - first_half
            loads: dict[str, Callable[[], None]] = {
                "b": lambda: _api(dsn, records, cpu["b"]),
                "s": lambda: _api(staged_dsn or "", records, cpu["s"]),
                "r": lambda: _raw_copy(dsn, records, cpu["r"]),
            }
            if staged_dsn is None:
                del loads["s"]
            for round_number in range(1, args.rounds + 1):
                # c runs half before the others and half after them, so that
                # a change of load during the round weighs on both sides of
                # the ratios; the others rotate.
                c_time = _seconds(first_half, conn, lambda: _single_inserts(conn, first_half))
                rates["a"].append(
                    args.jobs / _seconds(args.jobs, conn, lambda: _cli_file(dsn, path))
                )
                names = list(loads)
                for key in names[round_number % len(names) :] + names[: round_number % len(names)]:
                    rates[key].append(args.jobs / _seconds(args.jobs, conn, loads[key]))
                c_time += _seconds(second_half, conn, lambda: _single_inserts(conn, second_half))
                rates["c"].append(args.single_jobs / c_time)
                print(
                    f"# round {round_number}: "
                    + "  ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items() if v)
                    + " jobs/s",
                    file=sys.stderr,
                )
    names = {
        "a": "a_cli_file",
        "b": "b_api_enqueue_many",
        "s": "s_api_enqueue_many_staged",
        "r": "r_raw_copy",
        "c": "c_insert_per_transaction",
    }
    for key, name in names.items():
        if rates[key]:
            _summary(name, rates[key], "jobs/s")
    for top, bottom in ("ar", "br", "sr", "bs", "ac", "bc"):
        if rates[top] and rates[bottom]:
            ratios = [t / b for t, b in zip(rates[top], rates[bottom], strict=True)]
            _summary(f"ratio_{top}_over_{bottom}", ratios, "x")
    per = 100_000 / args.jobs
    for key in "bsr":
        for side, values in (
            ("client", [c for c, _ in cpu[key]]),
            ("server", [s for _, s in cpu[key]]),
        ):
            known = [v * per for v in values if v is not None]
            if known:
                _summary(f"{names[key]}_{side}_cpu_per_100k", known, "s")
    return 0


def _api(dsn: str, records: list[dict[str, Any]], cpu: list[tuple[float, float | None]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, _cpu(conn, cpu):
        pgqctl.enqueue_many(conn, records)


def _raw_copy(
    dsn: str, records: list[dict[str, Any]], cpu: list[tuple[float, float | None]]
) -> None:
    """As bench/contenders.py's raw COPY: each payload made JSON text here."""
    payloads = [r["payload"] for r in records]
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        _cpu(conn, cpu),
        conn.cursor() as cur,
        cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy,
    ):
        for payload in payloads:
            copy.write_row(("echo", json.dumps(payload)))


@contextmanager
def _cpu(conn: psycopg.Connection[Any], cpu: list[tuple[float, float | None]]) -> Iterator[None]:
    """Record the CPU seconds this process and the connection's backend spend in the block."""
    backend = conn.info.backend_pid
    client, server = time.process_time(), _backend_cpu(backend)
    yield
    after = _backend_cpu(backend)
    cpu.append(
        (
            time.process_time() - client,
            None if server is None or after is None else after - server,
        )
    )


_TICKS = os.sysconf("SC_CLK_TCK")


def _backend_cpu(pid: int) -> float | None:
    """A backend's CPU seconds so far; None when the server is not on this machine."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


@contextmanager
def _role_without_sequence(dsn: str) -> Iterator[str | None]:
    """A DSN of a role with the application role's grants of docs/operating.md
    (no privilege on the id sequence: its loads are staged); None when the
    bench may not create roles."""
    role = f"pgqctl_bench_app_{os.getpid()}"
    name = sql.Identifier(role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(name))
        except psycopg.errors.InsufficientPrivilege:
            yield None
            return
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(name))
            conn.execute(
                sql.SQL(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}"
                ).format(name)
            )
            yield conninfo.make_conninfo(dsn, user=role)
        finally:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(name))
            conn.execute(sql.SQL("DROP ROLE {}").format(name))


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
    digits = {"x": 1, "s": 2}.get(unit, 0)
    for stat, value in (
        ("median", statistics.median(values)),
        ("min", min(values)),
        ("max", max(values)),
    ):
        print(f"{name}_{stat}: {value:.{digits}f} {unit}")


if __name__ == "__main__":
    sys.exit(main())
