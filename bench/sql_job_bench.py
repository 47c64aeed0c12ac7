"""SQL handler jobs against `true` jobs: one burst worker draining each, side by side.

One `pgqctl worker --burst --concurrency C` process drains N jobs, timed
from its start to its exit (interpreter start-up, connecting and the final
reap included: the whole process, as an operator runs it), on three sides:

- `true`: jobs `{"argv": ["true"]}`, a child process per job, its "done"
  reported on the worker's next claim;
- `noop`: `--sql 'noop=SELECT $1::jsonb'`, nothing written: what running a
  job as a statement costs, with its own transaction and commit;
- `invoice`: `--sql 'invoice=CALL create_invoice($1)'`, the README's
  orders and invoices (an INSERT ... SELECT per job): in-database work as it
  is really done.

`empty` is the same worker with no job at all: its start-up and exit, the
fixed part of every side's time, shown so the rates can be read for what
they include. Each round runs every side once, in an order that rotates
from round to round; each ratio is taken within a round, then summarised.
Per side, also the CPU per job of the worker (the process and its
children, from the rusage its exit reports: start-up included, and the
`true` processes for that side) and, when the server runs on this machine,
of the server's processes (the SQL sides move the work there; on a server
other databases use, their work counts too).

    python bench/sql_job_bench.py [--dsn DSN] [--jobs 5000] [--concurrency 4] [--rounds 5]

Without --dsn it uses PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temp
data directory of its own, stopped at the end; either way a database of its
own, dropped at the end. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psycopg
import throwaway_db
from report import say, summary
from worker_bench import cpu_seconds, load, proc_cpu

T = TypeVar("T")

SCHEMA = """
CREATE TABLE orders (id bigint PRIMARY KEY, total_cents integer NOT NULL);
CREATE TABLE invoices (order_id bigint NOT NULL, total_cents integer NOT NULL);
CREATE PROCEDURE create_invoice(job jsonb) LANGUAGE sql AS $$
    INSERT INTO invoices (order_id, total_cents)
    SELECT id, total_cents FROM orders WHERE id = (job ->> 'order_id')::bigint
$$;
"""
ORDERS = "INSERT INTO orders SELECT g, g * 100 FROM generate_series(1, %(n)s) AS g"
FILL = """
INSERT INTO jobs (kind, payload)
SELECT %(kind)s, CASE WHEN %(kind)s = 'true' THEN '{"argv": ["true"]}'::jsonb
                      ELSE jsonb_build_object('order_id', g) END
FROM generate_series(1, %(n)s) AS g
"""
# Each side: the kind of its jobs (None: no job) and the worker's extra options.
SIDES: dict[str, tuple[str | None, list[str]]] = {
    "true": ("true", []),
    "noop": ("noop", ["--sql", "noop=SELECT $1::jsonb"]),
    "invoice": ("invoice", ["--sql", "invoice=CALL create_invoice($1)"]),
    "empty": (None, []),
}
DRAINS = ["true", "noop", "invoice"]  # the sides with jobs, rated in jobs/s


@dataclass
class Drain:
    seconds: float
    worker_cpu: float  # seconds: the worker process and its children
    server_cpu: float | None  # seconds: the server's processes; None: not on this machine


def find_postmaster(dsn: str) -> int | None:
    """The pid of the server's postmaster if it runs on this machine, else None:
    the parent of its checkpointer."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
    try:
        with open(f"/proc/{row[0] if row else 0}/stat") as f:
            name, _, rest = f.read().rpartition(")")
    except OSError:
        return None
    return int(rest.split()[1]) if name.endswith("(postgres") else None


def server_processes(postmaster: int) -> list[int]:
    """The postmaster's live children: backends and background processes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            found.append(int(entry))
    return found


def server_cpu(postmaster: int | None, settled: set[int] | None = None) -> float | None:
    """CPU seconds of one server: its postmaster with the backends it reaped,
    and its live processes; None if it does not run here. Only this server's:
    on a shared machine another one's work would count otherwise.

    With `settled` (its processes before the run), first waits a while for
    every other one to end and be reaped: one that ended between the reads
    would be counted in neither."""
    if postmaster is None:
        return None
    deadline = time.monotonic() + 5
    while settled is not None and time.monotonic() < deadline:
        if set(server_processes(postmaster)) <= settled:
            break
        time.sleep(0.02)
    total = sum(proc_cpu(postmaster))
    for pid in server_processes(postmaster):
        with contextlib.suppress(OSError):
            total += sum(proc_cpu(pid))
    return total


def prepare(dsn: str, jobs: int, kind: str | None) -> None:
    """An empty queue and no invoices, then `jobs` jobs of `kind`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs, invoices")
        if kind is not None:
            conn.execute(FILL, {"kind": kind, "n": jobs})
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("VACUUM ANALYZE invoices")


def run_worker(
    dsn: str, side: str, jobs: int, concurrency: int, log: Path, postmaster: int | None
) -> Drain:
    """One burst worker of `side` from start to exit, and the CPU it and the server used."""
    kind, options = SIDES[side]
    prepare(dsn, jobs, kind)
    command = [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn]
    command += ["--burst", "--concurrency", str(concurrency), *options]
    drain = timed_worker(command, log, postmaster, side)
    check_drained(dsn, side, jobs if kind else 0)
    return drain


def timed_worker(command: list[str], log: Path, postmaster: int | None, side: str) -> Drain:
    """Run one worker `command` from start to exit (its log in `log`): how long
    it took, and the CPU it and the server used; a worker that fails raises."""
    settled = set(server_processes(postmaster)) if postmaster is not None else None
    server = server_cpu(postmaster)
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    with log.open("w") as err:
        started = time.perf_counter()
        code = subprocess.call(command, stdout=subprocess.DEVNULL, stderr=err)
        seconds = time.perf_counter() - started
    # The one child run meanwhile: the worker, with the processes it waited for.
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    # The worker has exited, so its backends end too: the postmaster gets their CPU.
    server_after = server_cpu(postmaster, settled)
    if code != 0:
        raise RuntimeError(f"{side}: worker exit {code}: {log.read_text()[-1500:]}")
    return Drain(
        seconds,
        cpu,
        None if server is None or server_after is None else server_after - server,
    )


def check_all_done(dsn: str, side: str, jobs: int) -> None:
    """Every one of the `jobs` jobs done: a figure of a drain that did not
    do its work would mean nothing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FROM jobs"
        ).fetchone()
    if row != (jobs, jobs):
        raise RuntimeError(f"{side}: {row[0] if row else 0} of {jobs} jobs done")


def check_drained(dsn: str, side: str, jobs: int) -> None:
    """Every job done, and for `invoice` one invoice per order."""
    check_all_done(dsn, side, jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        invoices = conn.execute("SELECT count(DISTINCT order_id), count(*) FROM invoices")
        invoiced = invoices.fetchone()
    want = (jobs, jobs) if side == "invoice" else (0, 0)
    if invoiced != want:
        raise RuntimeError(f"{side}: invoices (orders, rows) {invoiced}, expected {want}")


def drain_arguments(doc: str, more: Sequence[tuple[str, str]] = ()) -> argparse.Namespace:
    """The options of a bench of burst worker drains: --dsn, --jobs, --concurrency,
    --rounds, and `more` text options (name, help)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    for name, help_text in more:
        parser.add_argument(name, help=help_text)
    parser.add_argument("--dsn", help="server to create the bench database in")
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs per drain")
    parser.add_argument("--concurrency", type=int, default=4, help="the worker's --concurrency")
    parser.add_argument("--rounds", type=int, default=5)
    return parser.parse_args()


def in_rounds(names: list[str], rounds: int, run: Callable[[str], T]) -> dict[str, list[T]]:
    """`run(side)` for every side in each round, the first side rotating from
    round to round; each side's results in round order."""
    found: dict[str, list[T]] = {side: [] for side in names}
    for round_no in range(rounds):
        shift = round_no % len(names)
        for side in names[shift:] + names[:shift]:
            found[side].append(run(side))
        say(f"round {round_no + 1} of {rounds} done, load {load()}")
    return found


def main() -> None:
    args = drain_arguments(__doc__ or "")
    names = list(SIDES)
    with (
        throwaway_db.server(args.dsn) as server_dsn,
        throwaway_db.database(server_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-sql-bench-") as tmp,
    ):
        log = Path(tmp) / "worker.log"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute(ORDERS, {"n": args.jobs})
            version = conn.execute("SHOW server_version").fetchone()
            commit = conn.execute("SHOW synchronous_commit").fetchone()
        postmaster = find_postmaster(dsn)
        if postmaster is None:
            say("the server does not run on this machine: no server CPU")
        for side in names:  # warm up: caches, the page cache of the programs
            run_worker(dsn, side, min(200, args.jobs), args.concurrency, log, postmaster)
        load_before = load()
        runs = in_rounds(
            names,
            args.rounds,
            lambda side: run_worker(dsn, side, args.jobs, args.concurrency, log, postmaster),
        )
        load_after = load()
    print(
        f"# {args.rounds} rounds; one `pgqctl worker --burst --concurrency {args.concurrency}` "
        f"draining {args.jobs:,} jobs per side, timed from start to exit"
    )
    print(
        f"# PostgreSQL {version[0] if version else '?'}, synchronous_commit "
        f"{commit[0] if commit else '?'}; {os.cpu_count()} CPUs; "
        f"load {load_before} before, {load_after} after (1, 5, 15 min)"
    )
    rates = {side: [args.jobs / d.seconds for d in runs[side]] for side in DRAINS}
    for side in DRAINS:
        print(f"drain.{side}: {summary(rates[side], 'jobs/s')}")
    print(f"start_and_exit (no job): {summary([d.seconds for d in runs['empty']], 's')}")
    for side in ("noop", "invoice"):
        ratios = [a / b for a, b in zip(rates[side], rates["true"], strict=True)]
        print(f"ratio drain {side}/true (rate): {summary(ratios, 'x')}")
    for side in DRAINS:
        cpu = [d.worker_cpu / args.jobs * 1e6 for d in runs[side]]
        print(f"cpu_worker.{side} (process and children): {summary(cpu, 'us/job')}")
        server = [d.server_cpu / args.jobs * 1e6 for d in runs[side] if d.server_cpu is not None]
        if len(server) == len(runs[side]):
            print(f"cpu_server.{side}: {summary(server, 'us/job')}")
    for side in ("noop", "invoice"):
        pairs = list(zip(runs[side], runs["true"], strict=True))
        worker = [a.worker_cpu / b.worker_cpu for a, b in pairs]
        print(f"ratio cpu_worker {side}/true: {summary(worker, 'x')}")
        both = [
            (a.worker_cpu + a.server_cpu) / (b.worker_cpu + b.server_cpu)
            for a, b in pairs
            if a.server_cpu is not None and b.server_cpu is not None
        ]
        if len(both) == len(pairs):
            print(f"ratio cpu_worker_and_server {side}/true: {summary(both, 'x')}")


if __name__ == "__main__":
    main()
