"""pgqctl through PgBouncer 1.18 in transaction pooling mode, as many production
databases are reached.

In transaction mode a server connection serves another client after every
transaction: session settings, prepared statements, session advisory locks and
LISTEN left on it by one client are met by the next. What users see of that is
checked here: jobs run in the wrong schema or not at all, workers reconnecting,
commands failing after a few statements, a `migrate` that never ends, another
application inheriting pgqctl's settings, and a worker that never hears of new
jobs.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import pgqctl as pgqctl_api
from tests.conftest import ctrl_c_at_default
from tests.support.processes import PgqctlProcess, start_pgqctl, trouble, wait_all
from tests.support.servers import (
    REPO_ROOT,
    Pooler,
    clean_env,
    insert_jobs,
    pgqctl,
    session_pooler,
    start_pooler,
    statuses,
    txn_pooler,
    wait_until,
)

__all__ = ["session_pooler", "start_pgqctl", "start_pooler", "txn_pooler"]


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result


def outcomes(dsn: str, schema: str) -> dict[tuple[str, str], int]:
    """(program run, status) -> number of jobs, in one schema."""
    query = sql.SQL(
        "SELECT payload->'argv'->>0, status, count(*) FROM {}.jobs GROUP BY 1, 2"
    ).format(sql.Identifier(schema))
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {(argv0, status): n for argv0, status, n in conn.execute(query).fetchall()}


@pytest.mark.slow
def test_workers_of_two_schemas_share_one_pool(
    empty_dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    for schema in ("sa", "sb"):
        ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", schema))
        insert_jobs(empty_dsn, [["true"], ["false"]] * 300, schema=schema, max_attempts=1)
    pooled = txn_pooler.dsn(empty_dsn)
    workers = [
        start_pgqctl(
            "worker",
            "--dsn",
            pooled,
            "--schema",
            schema,
            "--burst",
            "--concurrency",
            "4",
            name=f"worker-{schema}",
        )
        for schema in ("sa", "sb")
    ]
    assert wait_all(workers, timeout=180) == [0, 0], [w.log[-2000:] for w in workers]
    for schema in ("sa", "sb"):
        assert outcomes(empty_dsn, schema) == {("true", "done"): 300, ("false", "failed"): 300}


@pytest.mark.slow
def test_three_workers_run_5000_jobs_without_reconnecting(
    dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    insert_jobs(dsn, [["true"]] * 5000)
    pooled = txn_pooler.dsn(dsn)
    workers = [
        start_pgqctl("worker", "--dsn", pooled, "--burst", "--log-format", "json") for _ in range(3)
    ]
    codes = wait_all(workers, timeout=240)
    assert [line for w in workers for line in trouble(w)] == []
    assert codes == [0, 0, 0]
    assert statuses(dsn) == {"done": 5000}


class PoolTraffic:
    """Other applications on the same pool: short psql-like transactions, back to back.

    They take and release the pool's server connections all the time, so each
    transaction of a pgqctl command may land on another server connection, as
    in production; alone on a pool, a client would get the same one each time.
    """

    def __init__(self, pooled: str, clients: int = 2) -> None:
        self.pooled = pooled
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        # A client that fails just stops: the test judges pgqctl, not this load.
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.pooled, autocommit=True, prepare_threshold=None) as conn,
        ):
            while not self.stop.is_set():
                conn.execute("SELECT count(*) FROM pg_class")
                time.sleep(0.002)

    def __enter__(self) -> PoolTraffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


@pytest.mark.slow
def test_purge_deletes_50000_done_jobs(empty_dsn: str, txn_pooler: Pooler) -> None:
    ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", "q"))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO q.jobs (kind, payload, status, attempts, finished_at)"
            " SELECT 'old', '{}', 'done', 1, now() - interval '1 day'"
            " FROM generate_series(1, 50000)"
        )
    pooled = txn_pooler.dsn(empty_dsn)
    with PoolTraffic(pooled):
        result = pgqctl("purge", "--dsn", pooled, "--schema", "q", "--json", timeout=300)
    ok(result)
    assert json.loads(result.stdout) == {"deleted": 50000}
    assert statuses(empty_dsn, "q") == {}


@pytest.mark.slow
def test_enqueue_file_of_100000_lines(empty_dsn: str, txn_pooler: Pooler, tmp_path: Path) -> None:
    ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", "q"))
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        "".join(f'{{"kind": "bulk", "payload": {{"n": {n}}}}}\n' for n in range(100_000))
    )
    pooled = txn_pooler.dsn(empty_dsn)
    with PoolTraffic(pooled):
        result = pgqctl(
            "enqueue", "--dsn", pooled, "--schema", "q", "--file", str(jobs), "--json", timeout=300
        )
    ok(result)
    ids = [row["id"] for row in json.loads(result.stdout)]
    assert len(ids) == 100_000
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT id FROM q.jobs ORDER BY (payload->>'n')::int").fetchall()
    assert ids == [row[0] for row in stored]


def _read_objects(proc: subprocess.Popen[str], found: list[dict[str, Any]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        found.append(json.loads(line))


def test_ctrl_c_during_a_snapshot_ends_the_watch_once_it_is_done(
    dsn: str, txn_pooler: Pooler
) -> None:
    """Interrupted in the middle of a snapshot's query, the watch ended with
    an error (its connection still busy); it now finishes the snapshot and
    ends with 0."""
    watch = _start_watch(txn_pooler.dsn(dsn))
    try:
        assert watch.stdout is not None
        assert "totals" in json.loads(watch.stdout.readline())
        with psycopg.connect(dsn) as blocker:
            # The next snapshot waits for this lock, its query out.
            blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            time.sleep(0.5)
            watch.send_signal(signal.SIGINT)
            time.sleep(0.3)
            assert watch.poll() is None  # still in its snapshot
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert (watch.returncode, err) == (0, "")
    assert all("totals" in json.loads(line) for line in out.splitlines())


def _start_watch(pooled: str) -> subprocess.Popen[str]:
    """`stats --watch 0.1 --json`, piped, stopped with SIGINT as from a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "pgqctl", "stats", "--dsn", pooled, "--watch", "0.1", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO_ROOT,
        env=clean_env(),
        preexec_fn=ctrl_c_at_default,
    )


def _watch(pooled: str, watchers: int, snapshots: int) -> list[tuple[bool, int, int, str]]:
    """Run `stats --watch 0.1 --json` piped, `watchers` at once, until each has
    printed `snapshots` objects (or stopped), then Ctrl-C them.

    For each: whether it still ran then, how many objects it printed, its exit
    code and its stderr.
    """
    procs = [_start_watch(pooled) for _ in range(watchers)]
    seen: list[list[dict[str, Any]]] = [[] for _ in procs]
    for proc, found in zip(procs, seen, strict=True):
        threading.Thread(target=_read_objects, args=(proc, found), daemon=True).start()
    try:
        wait_until(
            lambda: (
                all(len(s) >= snapshots for s in seen) or any(p.poll() is not None for p in procs)
            ),
            60,
            f"{snapshots} snapshots from each watcher",
        )
        running = [p.poll() is None for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        codes = [proc.wait(10) for proc in procs]
    assert all(set(obj) >= {"totals", "queues"} for s in seen for obj in s)
    return [
        (r, len(s), code, p.stderr.read() if p.stderr else "")
        for r, s, code, p in zip(running, seen, codes, procs, strict=True)
    ]


def test_stats_watch_keeps_going_when_piped(dsn: str, txn_pooler: Pooler) -> None:
    # Two operators watching at once, among other clients of the pool.
    pooled = txn_pooler.dsn(dsn)
    with PoolTraffic(pooled):
        watched = _watch(pooled, watchers=2, snapshots=20)
    # Each still running after 20 snapshots; Ctrl-C is how a watch ends, not an error.
    outcome = [(running, n >= 20, code) for running, n, code, _ in watched]
    assert outcome == [(True, True, 0)] * 2, [err for *_, err in watched]


@pytest.mark.slow
def test_concurrent_migrations_through_the_pooler_finish(
    empty_dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    pooled = txn_pooler.dsn(empty_dsn)
    # Hold the first migration up (as a busy database would, by a lock it must
    # wait for) until all four have started, so that they really overlap.
    with PoolTraffic(pooled), psycopg.connect(empty_dsn) as blocker:
        blocker.execute("CREATE TABLE jobs (id int)")
        runs = [start_pgqctl("migrate", "--dsn", pooled, name="migrate") for _ in range(4)]
        # All four waiting (the first on the table held here, the others on it),
        # or, however they wait, surely all started.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _waiting_sessions(empty_dsn) < 4:
            if any(run.proc.poll() is not None for run in runs):
                break
            time.sleep(0.05)
        blocker.rollback()
        codes = wait_all(runs, timeout=30)
        assert codes == [0, 0, 0, 0], [run.log for run in runs]
        began = time.monotonic()
        fifth = pgqctl("migrate", "--dsn", pooled, timeout=30)
        elapsed = time.monotonic() - began
    assert fifth.returncode == 0, fifth.stderr
    # Nothing to do, and nothing left holding the migration lock: it returns
    # about as fast as the interpreter starts.
    assert elapsed < 5, f"the fifth migrate took {elapsed:.1f}s"
    assert pgqctl("migrate", "--dsn", empty_dsn, "--check").returncode == 0


def _waiting_sessions(dsn: str) -> int:
    """Sessions of this database waiting on a lock (the migrations, held up)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _server_sessions_state(pooled: str, pool_size: int) -> list[dict[str, Any]]:
    """What a psql-like client finds on each of the pool's server connections.

    Each client holds a transaction open while it looks, so `pool_size` clients
    at once occupy every server connection of the pool.
    """
    clients = [
        psycopg.connect(pooled, autocommit=True, prepare_threshold=None) for _ in range(pool_size)
    ]
    try:
        for client in clients:
            client.execute("BEGIN")
        found = []
        for client in clients:
            row = client.execute(
                "SELECT pg_backend_pid(), current_setting('search_path'),"
                " current_setting('statement_timeout'), current_setting('lock_timeout'),"
                " current_setting('plan_cache_mode'),"
                " ARRAY(SELECT pg_listening_channels()),"
                " ARRAY(SELECT name FROM pg_prepared_statements ORDER BY name),"
                " (SELECT count(*) FROM pg_locks"
                "   WHERE locktype = 'advisory' AND pid = pg_backend_pid())"
            ).fetchone()
            assert row is not None
            found.append(
                {
                    "pid": row[0],
                    "search_path": row[1],
                    "statement_timeout": row[2],
                    "lock_timeout": row[3],
                    "plan_cache_mode": row[4],
                    "listening": row[5],
                    "prepared": row[6],
                    "advisory_locks": row[7],
                }
            )
        for client in clients:
            client.execute("COMMIT")
    finally:
        for client in clients:
            client.close()
    return found


@pytest.mark.slow
def test_other_clients_of_the_pool_see_no_pgqctl_state(
    empty_dsn: str,
    start_pooler: Callable[..., Pooler],
    start_pgqctl: Callable[..., PgqctlProcess],
    tmp_path: Path,
) -> None:
    # A pool of 2: the client below surely lands on the connections pgqctl used.
    pooler = start_pooler("transaction", pool_size=2)
    ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", "qs"))
    pooled = pooler.dsn(empty_dsn)
    common = ("--dsn", pooled, "--schema", "qs")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"kind": "bulk", "payload": {"argv": ["true"]}}\n' * 300)
    failed: list[str] = []

    def run(*args: str) -> None:
        # Recorded rather than asserted at once: what the pool's other clients
        # see is the point here, whichever commands went wrong on the way.
        try:
            result = pgqctl(*args, *common, timeout=60)
        except subprocess.TimeoutExpired:
            failed.append(f"{' '.join(args)}: still running after 60s")
            return
        if result.returncode != 0:
            failed.append(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")

    run("enqueue", "one", '{"argv": ["true"]}')
    run("enqueue", "two", '{"argv": ["false"]}', "--max-attempts", "1")
    run("enqueue", "--file", str(jobs))
    run("worker", "--burst", "--concurrency", "2")
    # A worker that idles long enough to listen for new jobs, then stops.
    idle = start_pgqctl("worker", *common, "--log-format", "json", name="idle")
    wait_until(lambda: "worker_started" in idle.log, 20, "the worker to start")
    time.sleep(1)
    idle.proc.send_signal(signal.SIGTERM)
    if idle.wait(timeout=30) != 0:
        failed.append(f"worker: {idle.log[-500:]}")
    for command in (
        ("stats",),
        ("stats", "--json"),
        ("list", "--status", "failed"),
        ("leases",),
        ("reap",),
        ("requeue", "--failed"),
        ("purge",),
        ("migrate", "--status"),
        ("migrate", "--check"),
        # Would notify any server connection left listening.
        ("enqueue", "late", '{"argv": ["true"]}'),
    ):
        run(*command)

    defaults = {
        "search_path": '"$user", public',
        "statement_timeout": "0",
        "lock_timeout": "0",
        "plan_cache_mode": "auto",
        "listening": [],
        "prepared": [],
        "advisory_locks": 0,
    }
    found = _server_sessions_state(pooled, pool_size=2)
    left = [{k: v for k, v in s.items() if k != "pid"} for s in found]
    assert left == [defaults, defaults], json.dumps(found)
    assert failed == []


def _start_delay(dsn: str, kind: str) -> float:
    """Seconds from the commit of a new job to a worker claiming it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            'INSERT INTO jobs (kind, payload) VALUES (%s, \'{"argv": ["true"]}\') RETURNING id',
            (kind,),
        ).fetchone()
        committed = time.monotonic()
        assert row is not None
        while True:
            claimed = conn.execute(
                "SELECT attempts > 0 FROM jobs WHERE id = %s", (row[0],)
            ).fetchone()
            if claimed and claimed[0]:
                return time.monotonic() - committed
            if time.monotonic() - committed > 15:
                return float("inf")
            time.sleep(0.01)


def _idle_start_delays(dsn: str, worker: PgqctlProcess, rounds: int = 3) -> list[float]:
    """Enqueue one job at a time into an idle worker; how long each took to start."""
    wait_until(
        lambda: "worker_started" in worker.log or worker.proc.poll() is not None,
        20,
        "the worker to start",
    )
    assert worker.proc.poll() is None, worker.log
    delays = []
    for n in range(rounds):
        # Idle: past its start, and past the previous job's claim.
        time.sleep(0.5)
        delays.append(_start_delay(dsn, f"idle{n}"))
    return delays


def _listen_warnings(worker: PgqctlProcess) -> list[str]:
    return [
        str(r.get("message", ""))
        for r in worker.events()
        if "--listen-dsn" in str(r.get("message", ""))
    ]


@pytest.mark.slow
def test_worker_behind_a_transaction_pooler_says_it_polls_and_still_starts_jobs_soon(
    dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    worker = start_pgqctl("worker", "--dsn", txn_pooler.dsn(dsn), "--log-format", "json")
    delays = _idle_start_delays(dsn, worker)
    assert max(delays) < 2, f"jobs started {delays} s after their enqueue"
    warnings = _listen_warnings(worker)
    # One line, saying why (LISTEN, or the notifications it would bring, cannot
    # work here) and what to do about it.
    assert len(warnings) == 1, worker.log
    assert re.search(r"LISTEN|notification", warnings[0], re.IGNORECASE), warnings[0]


@pytest.mark.slow
def test_worker_with_a_direct_listen_connection_starts_jobs_at_once(
    dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    worker = start_pgqctl(
        "worker", "--dsn", txn_pooler.dsn(dsn), "--listen-dsn", dsn, "--log-format", "json"
    )
    delays = _idle_start_delays(dsn, worker)
    assert statistics.median(delays) < 0.5 and max(delays) < 1, delays
    assert _listen_warnings(worker) == []


@pytest.mark.slow
def test_worker_behind_a_session_pooler_hears_new_jobs(
    dsn: str, session_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    worker = start_pgqctl("worker", "--dsn", session_pooler.dsn(dsn), "--log-format", "json")
    delays = _idle_start_delays(dsn, worker)
    assert statistics.median(delays) < 0.5 and max(delays) < 1, delays
    assert _listen_warnings(worker) == []


@pytest.mark.slow
def test_two_workers_behind_a_transaction_pooler_tick_a_schedule_once_per_tick(
    dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    # No notification reaches them here, and no statement may lean on a
    # session: the ticks still come, each one job.
    pooled = txn_pooler.dsn(dsn)
    ok(
        pgqctl(
            "schedule",
            "add",
            "beat",
            "--every",
            "1s",
            "k",
            '{"argv": ["true"]}',
            "--dsn",
            pooled,
            "--overlap",
            "allow",
        )
    )
    workers = [start_pgqctl("worker", "--dsn", pooled, "--no-reap") for _ in range(2)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        count = "SELECT count(*), count(DISTINCT tick) FROM jobs WHERE tick IS NOT NULL"
        wait_until(lambda: (conn.execute(count).fetchone() or [0])[0] >= 5, 20, "five ticks")
        for w in workers:
            wait_until(lambda w=w: " started: " in w.log, 10, "the worker to start")
            w.proc.send_signal(signal.SIGTERM)
        assert wait_all(workers, 20) == [0, 0]
        jobs, ticks = conn.execute(count).fetchone() or (0, 0)
    assert jobs == ticks >= 5


def _produce(
    pooled: str, schema: str, how: str, jobs: int, start: threading.Barrier, errors: list[str]
) -> None:
    """Enqueue `jobs` jobs into `schema` through the pool with the Python API,
    on a connection as an application opens it (psycopg's defaults: it
    prepares a statement from its sixth run)."""
    batch = {"enqueue": 1, "unique_key": 1, "transaction": 1, "many": 5, "many_copy": 200}[how]
    try:
        with psycopg.connect(pooled, autocommit=how != "transaction") as conn:
            start.wait(30)  # both at once: their transactions interleave on the pool
            for first in range(0, jobs, batch):
                numbers = range(first, min(jobs, first + batch))
                if how == "many" or how == "many_copy":
                    records = [{"kind": "k", "payload": {"from": schema, "n": n}} for n in numbers]
                    pgqctl_api.enqueue_many(conn, records, schema=schema)
                    continue
                key = f"{schema}:{first}" if how == "unique_key" else None
                pgqctl_api.enqueue(
                    conn, "k", {"from": schema, "n": first}, unique_key=key, schema=schema
                )
                if how == "transaction":
                    conn.commit()
    except Exception as exc:  # recorded for the assertion, with what the producer saw
        errors.append(f"{schema}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize(
    ("how", "jobs"),
    [
        ("enqueue", 500),
        ("unique_key", 500),
        ("transaction", 500),
        ("many", 500),
        ("many_copy", 4000),  # twenty loads each: psycopg prepares on the sixth
    ],
)
def test_two_producers_of_two_schemas_share_a_pool_of_two(
    empty_dsn: str, start_pooler: Callable[..., Pooler], how: str, jobs: int
) -> None:
    pooler = start_pooler("transaction", pool_size=2)
    for schema in ("a", "b"):
        ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", schema))
    pooled = pooler.dsn(empty_dsn)
    errors: list[str] = []
    start = threading.Barrier(2)
    producers = [
        threading.Thread(target=_produce, args=(pooled, schema, how, jobs, start, errors))
        for schema in ("a", "b")
    ]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(120)
    assert errors == []
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        found = {
            schema: dict(
                conn.execute(
                    sql.SQL("SELECT payload->>'from', count(*) FROM {}.jobs GROUP BY 1").format(
                        sql.Identifier(schema)
                    )
                ).fetchall()
            )
            for schema in ("a", "b")
        }
    assert found == {"a": {"a": jobs}, "b": {"b": jobs}}


# A job's program that writes a note and completes its job in one transaction,
# connected through the pooler with its own DSN (the schema from the worker).
COMPLETING_PROGRAM = r"""
import os, psycopg, pgqctl
with psycopg.connect(os.environ["APP_DSN"], autocommit=True) as conn, conn.transaction():
    conn.execute(
        "INSERT INTO public.notes VALUES (%s, %s)",
        (os.environ["PGQCTL_JOB_SCHEMA"], int(os.environ["PGQCTL_JOB_ID"])),
    )
    pgqctl.complete_job(conn)
"""


@pytest.mark.slow
def test_sql_handlers_and_completing_programs_of_two_schemas_share_one_pool(
    empty_dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    """Each job's work and its "done" commit together in its own schema, through
    a pool whose server connections the two schemas' workers and programs share."""
    pooled = txn_pooler.dsn(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.notes (schema text NOT NULL, job_id bigint NOT NULL)")
    statement = (
        "note=INSERT INTO public.notes SELECT $1::jsonb ->> 'schema', ($1::jsonb ->> 'n')::bigint"
    )
    for schema in ("sa", "sb"):
        ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", schema))
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (kind, payload) SELECT 'note', "
                    "jsonb_build_object('schema', %s::text, 'n', g) FROM generate_series(1, 300) g"
                ).format(sql.Identifier(schema)),
                (schema,),
            )
            program = {
                "argv": [sys.executable, "-c", COMPLETING_PROGRAM],
                "env": {"APP_DSN": pooled},
            }
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.jobs (kind, payload) "
                    "SELECT 'program', %s FROM generate_series(1, 30)"
                ).format(sql.Identifier(schema)),
                (json.dumps(program),),
            )
    workers = [
        start_pgqctl(
            "worker", "--dsn", pooled, "--schema", schema, "--burst", "--concurrency", "4",
            "--sql", statement, "--log-format", "json", name=f"worker-{schema}",
        )
        for schema in ("sa", "sb")
    ]  # fmt: skip
    assert wait_all(workers, timeout=180) == [0, 0], [w.log[-2000:] for w in workers]
    assert [line for w in workers for line in trouble(w)] == []
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for schema in ("sa", "sb"):
            assert statuses(empty_dsn, schema) == {"done": 330}
            counted = conn.execute(
                "SELECT count(*), count(DISTINCT job_id) FROM public.notes WHERE schema = %s",
                (schema,),
            ).fetchone()
            assert counted == (330, 330), (schema, counted)


@pytest.mark.slow
def test_limits_of_two_schemas_hold_through_one_transaction_pool(
    empty_dsn: str, txn_pooler: Pooler, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    limits = {"sa": 2, "sb": 3}
    for schema, most in limits.items():
        ok(pgqctl("migrate", "--dsn", empty_dsn, "--schema", schema))
        ok(
            pgqctl(
                "limit",
                "set",
                "--dsn",
                empty_dsn,
                "--schema",
                schema,
                "--kind",
                "job",
                "--concurrency",
                str(most),
            )
        )
        insert_jobs(empty_dsn, [["sleep", "0.02"]] * 200, schema=schema, kind="job")
    pooled = txn_pooler.dsn(empty_dsn)
    seen = dict.fromkeys(limits, 0)
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            while not stop.is_set():
                for schema in limits:
                    query = sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'running'").format(
                        sql.Identifier(schema)
                    )
                    [(running,)] = conn.execute(query).fetchall()
                    seen[schema] = max(seen[schema], running)
                time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    workers = [
        start_pgqctl(
            "worker",
            "--dsn",
            pooled,
            "--schema",
            schema,
            "--burst",
            "--concurrency",
            "4",
            name=f"worker-{schema}-{n}",
        )
        for schema in limits
        for n in range(2)
    ]
    codes = wait_all(workers, timeout=240)
    stop.set()
    sampler.join()
    assert codes == [0, 0, 0, 0], [w.log[-2000:] for w in workers]
    assert seen == limits
    for schema in limits:
        assert outcomes(empty_dsn, schema) == {("sleep", "done"): 200}
