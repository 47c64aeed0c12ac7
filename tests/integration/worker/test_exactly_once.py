"""Delivered many times, invoiced once: the invoice and the job's "done" in one transaction.

The seed's invoice example with real processes and real kill -9: 500
create_invoice jobs, run (a) by a program that writes the invoice and
completes its job in its own transaction, and (b) by a SQL handler. Workers
and programs are killed at random points, many times, often between the
invoice's INSERT and the COMMIT. The invoices table has no unique
constraint: only the transaction keeps each order to one invoice.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.jobrows import insert_jobs
from tests.support.processes import PgqctlProcess

ORDERS = 500

# A job's program: the invoice, then its job done, in one transaction. It
# waits a little between the two, so that a kill often lands there.
PROGRAM = r"""
import os, random, time, psycopg
job, claim = int(os.environ["PGQCTL_JOB_ID"]), int(os.environ["PGQCTL_JOB_CLAIM"])
order = int(os.environ["ORDER_ID"])
app_dsn, name = os.environ["APP_DSN"], f"invoice {os.getpid()}"
with psycopg.connect(app_dsn, autocommit=True, application_name=name) as conn, conn.transaction():
    conn.execute(
        "INSERT INTO invoices (order_id, total_cents) "
        "SELECT id, total_cents FROM orders WHERE id = %s", (order,))
    time.sleep(random.uniform(0, 0.05))
    conn.execute("SELECT pgqctl_complete_job(%s, %s)", (job, claim))
"""

CREATE_INVOICE = """
CREATE PROCEDURE create_invoice(job jsonb) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO invoices (order_id, total_cents)
    SELECT id, total_cents FROM orders WHERE id = (job ->> 'order_id')::bigint;
    PERFORM pg_sleep(random() * 0.05);
END $$
"""


def set_up_orders(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY, total_cents integer NOT NULL)")
    # No unique constraint on order_id: the point is that none is needed.
    conn.execute(
        "CREATE TABLE invoices (id bigserial PRIMARY KEY, order_id bigint NOT NULL, "
        "total_cents integer NOT NULL)"
    )
    conn.execute("INSERT INTO orders SELECT g, g * 100 FROM generate_series(1, %s) AS g", (ORDERS,))


def job_programs(pid: int) -> list[int]:
    """The worker's children that run jobs (not its guard)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if ppid == pid and b"pgqctl.guard" not in command:
            found.append(int(name))
    return found


def programs_in_transaction(conn: psycopg.Connection[Any], programs: list[int]) -> list[int]:
    """Those of `programs` that have inserted their invoice and not yet committed."""
    rows = conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'invoice %%' AND backend_xid IS NOT NULL"
    ).fetchall()
    inside = {int(name.split()[1]) for (name,) in rows}
    return [pid for pid in programs if pid in inside]


def run_with_kills(
    conn: psycopg.Connection[Any],
    dsn: str,
    tmp_path: Path,
    worker_args: list[str],
    kill_programs: bool,
) -> dict[str, int]:
    """Run workers until every job is done, killing workers (and, when
    `kill_programs`, job programs) with SIGKILL at random moments; how many
    of each were killed."""
    rng = random.Random(os.environ.get("PYTEST_XDIST_WORKER", "") + str(time.time()))
    command = ["worker", "--dsn", dsn, "--concurrency", "4"]
    command += ["--lease", "2s", "--reap-every", "1s", "--backoff", "0.1s", *worker_args]
    kills = {"worker": 0, "program": 0}

    def start() -> PgqctlProcess:
        return PgqctlProcess(command, tmp_path / f"worker-{kills['worker']}.log")

    worker = start()
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.2, 0.8))
            pending = conn.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone()
            if pending is not None and pending[0] == 0:
                break
            if kills["worker"] + kills["program"] >= 40 and ids_rolled_back(conn) > 0:
                # Enough, and at least one kill landed inside a transaction
                # (the window tested): let the rest finish.
                continue
            programs = job_programs(worker.pid) if kill_programs else []
            if programs and rng.random() < 0.7:
                # One between its INSERT and its COMMIT when there is one: a
                # random pick mostly hits a program still starting up (more so
                # on a busy machine), and the window is what is tested.
                inside = programs_in_transaction(conn, programs)
                with_kill(rng.choice(inside or programs))
                kills["program"] += 1
                continue
            worker.kill()
            kills["worker"] += 1
            worker = start()
    finally:
        worker.stop(60)
    return kills


def ids_rolled_back(conn: psycopg.Connection[Any]) -> int:
    """Invoice ids taken by no committed row: transactions rolled back (or
    still open, a moment before their commit)."""
    row = conn.execute(
        "SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM invoices_id_seq)"
        " - (SELECT count(*) FROM invoices)"
    ).fetchone()
    return 0 if row is None else row[0]


def with_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.kill(pid, signal.SIGKILL)


def assert_invoiced_once(conn: psycopg.Connection[Any], kills: dict[str, int]) -> None:
    statuses = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())
    assert statuses == {"done": ORDERS}, (statuses, kills)
    per_order = conn.execute(
        "SELECT o.id, count(i.id), min(i.total_cents) = o.total_cents FROM orders o "
        "LEFT JOIN invoices i ON i.order_id = o.id GROUP BY o.id"
    ).fetchall()
    assert len(per_order) == ORDERS
    assert [r for r in per_order if r[1] != 1 or not r[2]] == [], kills
    # Invoices were written and rolled back: each took an id that no row has.
    rolled_back = ids_rolled_back(conn)
    assert rolled_back > 0, kills
    retried = conn.execute("SELECT count(*) FROM jobs WHERE attempts > 1").fetchone()
    assert retried is not None and retried[0] > 0, kills
    # Shown with -s: what the run went through.
    print(f"kills {kills}, invoices rolled back {rolled_back}, jobs retried {retried[0]}")


@pytest.mark.slow
def test_a_program_killed_before_its_commit_invoices_once(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    set_up_orders(conn)
    payloads = [
        {
            "argv": [sys.executable, "-c", PROGRAM],
            "env": {"APP_DSN": dsn, "ORDER_ID": str(n)},
        }
        for n in range(1, ORDERS + 1)
    ]
    insert_jobs(conn, payloads, kind="create_invoice", max_attempts=1000)
    kills = run_with_kills(conn, dsn, tmp_path, [], kill_programs=True)
    assert kills["worker"] > 0 and kills["program"] > 0, kills
    assert_invoiced_once(conn, kills)


@pytest.mark.slow
def test_a_sql_handler_killed_before_its_commit_invoices_once(
    conn: psycopg.Connection[Any], dsn: str, tmp_path: Path
) -> None:
    set_up_orders(conn)
    conn.execute(CREATE_INVOICE)
    payloads = [{"order_id": n} for n in range(1, ORDERS + 1)]
    insert_jobs(conn, payloads, kind="create_invoice", max_attempts=1000)
    args = ["--sql", "create_invoice=CALL create_invoice($1)"]
    kills = run_with_kills(conn, dsn, tmp_path, args, kill_programs=False)
    assert kills["worker"] > 0, kills
    assert_invoiced_once(conn, kills)
