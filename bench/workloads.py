"""The workloads of the comparison, each run once per round for every contender.

A workload measures its contenders back to back, in an order that rotates with
the round, and records one value per figure per round. Its ratios are computed
within each round by the harness. A contender that needs a pgqctl piece this
checkout lacks raises Skip, and is reported as waiting for it.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pgqctl_adapter
from contenders import stamp_argv
from harness import (
    Child,
    Env,
    Ratio,
    Record,
    Skip,
    connect,
    execute,
    percentile,
    rotated,
    run_child,
    run_children,
    run_pgqctl,
    say,
    scalar,
    truncate_all,
)
from shared_sql import HISTORY, LIVE_SET, REEXPIRE

SEED_SCHEMA = "seed"
# The seed's own index for its claim order (run_at, id). pgqctl's claim index
# leads with priority, which the seed's ORDER BY cannot use.
SEED_INDEX = (
    "CREATE INDEX IF NOT EXISTS jobs_pending_idx ON jobs (run_at, id) WHERE status = 'pending'"
)
LOAD_JOBS = """
INSERT INTO jobs (kind, payload)
SELECT 'bench', %(payload)s::jsonb
FROM generate_series(1, %(n)s) AS i
"""


def attempt(record: Record, name: str, round_no: int, measure: Callable[[], None]) -> None:
    """Run one contender; a Skip is recorded as what it waits for, a failure as such.

    A failure does not stop the run: the other figures are still worth having.
    """
    try:
        measure()
    except Skip as exc:
        record.skip(name, str(exc))
    except Exception as exc:
        say(f"  {name} failed: {exc}")
        record.fail(name, round_no, f"{type(exc).__name__}: {exc}")


def load_pgqctl_jobs(dsn: str, schema: str, n: int, payload: dict[str, Any]) -> None:
    """Empty a pgqctl jobs table and fill it with n due jobs, as plain SQL would."""
    with connect(dsn, schema) as conn:
        conn.execute("TRUNCATE jobs RESTART IDENTITY")
        conn.execute(LOAD_JOBS, {"n": n, "payload": json.dumps(payload)})
        conn.execute("ANALYZE jobs")


def done_window(dsn: str, schema: str, n: int) -> float:
    """Seconds between the first and the last job finishing; check all n are done."""
    with connect(dsn, schema) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*),"
            " extract(epoch FROM max(finished_at) - min(finished_at))::float8 FROM jobs"
        ).fetchone()
    assert row is not None
    done, total, window = row
    if done != n or total != n:
        raise RuntimeError(f"expected {n} jobs done, found {done} done of {total}")
    return float(window)


def pgqctl_in_process(*args: str) -> str:
    """Run a pgqctl command in this process (no interpreter start-up); return its stdout."""
    from pgqctl import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    if code != 0:
        raise RuntimeError(f"pgqctl {args[0]} exited {code}: {err.getvalue().strip()[-300:]}")
    return out.getvalue()


# ------------------------------------------------------------ bulk enqueue


class BulkEnqueue:
    name = "bulk_enqueue"
    ratios = (
        # Against the database's own limit: a raw COPY of the same jobs.
        Ratio(
            "bulk_enqueue.pgqctl_api/raw_copy",
            "bulk_enqueue.pgqctl_api",
            "bulk_enqueue.raw_copy",
            (">=", 0.8),
        ),
        Ratio(
            "bulk_enqueue.pgqctl_cli/raw_copy",
            "bulk_enqueue.pgqctl_cli",
            "bulk_enqueue.raw_copy",
            (">=", 0.6),
        ),
        Ratio(
            "bulk_enqueue.pgqctl_cli/pgqueuer",
            "bulk_enqueue.pgqctl_cli",
            "bulk_enqueue.pgqueuer",
            (">=", 2.5),
        ),
        Ratio(
            "bulk_enqueue.pgqctl_api/pgqueuer",
            "bulk_enqueue.pgqctl_api",
            "bulk_enqueue.pgqueuer",
            (">=", 2.5),
        ),
        Ratio(
            "bulk_enqueue.pgqctl_cli/procrastinate",
            "bulk_enqueue.pgqctl_cli",
            "bulk_enqueue.procrastinate",
            (">=", 6),
        ),
        Ratio(
            "bulk_enqueue.pgqctl_api/procrastinate",
            "bulk_enqueue.pgqctl_api",
            "bulk_enqueue.procrastinate",
            (">=", 6),
        ),
    )

    def setup(self, env: Env, record: Record) -> None:
        self.n = env.sizes.enqueue_jobs
        self.file = env.tmp / "enqueue.jsonl"
        with self.file.open("w") as out:
            for i in range(self.n):
                out.write(json.dumps({"kind": "bench", "payload": {"n": i}}) + "\n")

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        contenders: dict[str, Callable[[Env], float]] = {
            "pgqctl_cli": self.pgqctl_cli,
            "pgqctl_api": self.pgqctl_api,
            "raw_copy": self.raw_copy,
            "pgqueuer": self.pgqueuer,
            "procrastinate": self.procrastinate,
        }
        for name in rotated(list(contenders), round_no):
            figure = f"{self.name}.{name}"

            def measure(name: str = name, figure: str = figure) -> None:
                rate = contenders[name](env)
                record.add(figure, round_no, rate, "jobs/s", higher=True)

            attempt(record, figure, round_no, measure)

    def pgqctl_cli(self, env: Env) -> float:
        """`pgqctl enqueue --file`, timed from exec to exit as a user runs it."""
        env.require_command("enqueue")
        dsn = env.dsns["pgqctl"]
        truncate_all(dsn, "jobs")
        began = time.time()
        subprocess.run(
            [env.pgqctl_bin, "enqueue", "--file", str(self.file), "--dsn", dsn],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        elapsed = time.time() - began
        self.check_count(scalar(dsn, "SELECT count(*) FROM jobs"))
        return self.n / elapsed

    def pgqctl_api(self, env: Env) -> float:
        env.require_api("api")
        return self.child_rate("enqueue_pgqctl_api", env.dsns["pgqctl"], "jobs")

    def raw_copy(self, env: Env) -> float:
        return self.child_rate("enqueue_raw_copy", env.dsns["pgqctl"], "jobs")

    def pgqueuer(self, env: Env) -> float:
        dsn = env.dsns["pgqueuer"]
        return self.child_rate("enqueue_pgqueuer", dsn, "pgqueuer", driver="asyncpg")

    def procrastinate(self, env: Env) -> float:
        return self.child_rate("enqueue_procrastinate", env.dsns["procrastinate"], "procrastinate_")

    def child_rate(self, action: str, dsn: str, tables: str, **config: Any) -> float:
        """Jobs/s of one contender's child enqueueing n jobs into emptied `tables`."""
        truncate_all(dsn, tables)
        result = run_child(action, {"dsn": dsn, "n": self.n, **config}, timeout=600)
        self.check_count(result["count"])
        return self.n / float(result["elapsed"])

    def check_count(self, count: int) -> None:
        if count != self.n:
            raise RuntimeError(f"enqueued {count} jobs, expected {self.n}")


# ------------------------------------------------------------------- drain


class Drain:
    """n no-op jobs drained by several worker processes, each taking `slots` at once."""

    name = "drain"
    ratios = (
        Ratio("drain.pgqctl/pgqueuer_asyncpg", "drain.pgqctl", "drain.pgqueuer_asyncpg", (">=", 2)),
        Ratio("drain.pgqctl/procrastinate", "drain.pgqctl", "drain.procrastinate", (">=", 20)),
        Ratio("drain.pgqctl/pgqueuer_psycopg", "drain.pgqctl", "drain.pgqueuer_psycopg"),
        Ratio("drain.pgqctl/seed_loop", "drain.pgqctl", "drain.seed_loop"),
        Ratio(
            "drain.pgqctl_no_prefetch/pgqueuer_asyncpg",
            "drain.pgqctl_no_prefetch",
            "drain.pgqueuer_asyncpg",
        ),
    )

    def setup(self, env: Env, record: Record) -> None:
        sizes = env.sizes
        self.n = sizes.drain_jobs
        record.note(
            f"drain: {self.n} no-op jobs, {sizes.drain_workers} worker processes, each taking "
            f"up to {sizes.slots} jobs at once (pgqueuer batch_size, procrastinate "
            "concurrency, pgqctl slots); pgqctl's exchange as `pgqctl worker --concurrency "
            f"{sizes.slots} --prefetch {sizes.slots} --no-history` sends it (up to "
            f"{2 * sizes.slots} jobs claimed per exchange; drain.pgqctl_no_prefetch: "
            f"--prefetch 0, up to {sizes.slots}); the seed loop takes one job per claim."
        )

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        contenders = [
            "pgqctl",
            "pgqctl_no_prefetch",
            "pgqueuer_asyncpg",
            "pgqueuer_psycopg",
            "procrastinate",
            "seed_loop",
        ]
        for name in rotated(contenders, round_no):
            figure = f"{self.name}.{name}"

            def measure(name: str = name, figure: str = figure) -> None:
                rate = self.drain(env, name)
                record.add(figure, round_no, rate, "jobs/s", higher=True)

            attempt(record, figure, round_no, measure)

    def drain(self, env: Env, name: str) -> float:
        sizes = env.sizes
        dsn = env.dsns["pgqctl"]
        config: dict[str, Any] = {"dsn": dsn, "slots": sizes.slots}
        if name.startswith("pgqctl"):
            env.require_api("claims")
            load_pgqctl_jobs(dsn, "public", self.n, {})
            action = "drain_pgqctl"
            # The worker's --prefetch: as many jobs ahead as it has slots.
            config["prefetch"] = 0 if name == "pgqctl_no_prefetch" else sizes.slots
        elif name == "seed_loop":
            load_pgqctl_jobs(dsn, SEED_SCHEMA, self.n, {})
            action, config["schema"] = "drain_seed", SEED_SCHEMA
        elif name.startswith("pgqueuer"):
            dsn = config["dsn"] = env.dsns["pgqueuer"]
            config["driver"] = name.removeprefix("pgqueuer_")
            truncate_all(dsn, "pgqueuer")
            run_child("enqueue_pgqueuer", {"dsn": dsn, "n": self.n, "driver": "asyncpg"}, 600)
            execute(dsn, "ANALYZE")
            action = "drain_pgqueuer"
        else:
            dsn = config["dsn"] = env.dsns["procrastinate"]
            truncate_all(dsn, "procrastinate_")
            run_child("enqueue_procrastinate", {"dsn": dsn, "n": self.n}, 600)
            execute(dsn, "ANALYZE")
            action = "drain_procrastinate"
        timeout = max(120.0, self.n / 50)
        go, results = run_children(action, [config] * sizes.drain_workers, timeout)
        elapsed = max(float(result["end"]) for result in results) - go
        self.check_drained(env, name)
        return self.n / elapsed

    def check_drained(self, env: Env, name: str) -> None:
        if name.startswith("pgqueuer"):
            left = scalar(env.dsns["pgqueuer"], "SELECT count(*) FROM pgqueuer")
        elif name == "procrastinate":
            left = scalar(
                env.dsns["procrastinate"],
                "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
            )
        else:
            schema = SEED_SCHEMA if name == "seed_loop" else "public"
            left = scalar(
                env.dsns["pgqctl"], "SELECT count(*) FROM jobs WHERE status <> 'done'", schema
            )
        if left:
            raise RuntimeError(f"{name} left {left} jobs undone")


# -------------------------------------------------------------- end to end


class EndToEnd:
    """Jobs whose command is `true`, at several concurrencies.

    Rates are steady-state: jobs finished between the first and the last
    completion, divided by that window, for every contender alike, so process
    start-up is not counted.
    """

    name = "e2e"
    ratios = (
        # The worker's targets against the spawn limit are bench/worker_bench.py's
        # (--only figures), measured against the bare loop as well.
        Ratio("e2e.c4.pgqctl_worker/spawn_limit", "e2e.c4.pgqctl_worker", "e2e.c4.spawn_limit"),
        Ratio("e2e.c1.pgqctl_worker/spawn_limit", "e2e.c1.pgqctl_worker", "e2e.c1.spawn_limit"),
        Ratio("e2e.c8.pgqctl_worker/spawn_limit", "e2e.c8.pgqctl_worker", "e2e.c8.spawn_limit"),
        Ratio("e2e.c4.pgqctl_worker/seed_loop", "e2e.c4.pgqctl_worker", "e2e.c4.seed_loop"),
    )

    def setup(self, env: Env, record: Record) -> None:
        self.n = env.sizes.e2e_jobs
        record.note(
            f"e2e: {self.n} jobs running `true` per contender and concurrency; the spawn limit "
            "is a pool of threads calling subprocess.run(['true']); the seed loop runs one "
            "process per concurrency slot."
        )

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        contenders: dict[str, Callable[[Env, int], float]] = {
            "pgqctl_worker": self.pgqctl_worker,
            "spawn_limit": self.spawn_limit,
            "seed_loop": self.seed_loop,
        }
        for concurrency in rotated(env.sizes.concurrencies, round_no):
            for name in rotated(list(contenders), round_no):
                figure = f"{self.name}.c{concurrency}.{name}"

                def measure(name: str = name, figure: str = figure, c: int = concurrency) -> None:
                    rate = contenders[name](env, c)
                    record.add(figure, round_no, rate, "jobs/s", higher=True)

                attempt(record, figure, round_no, measure)

    def pgqctl_worker(self, env: Env, concurrency: int) -> float:
        env.require_command("worker")
        dsn = env.dsns["pgqctl"]
        load_pgqctl_jobs(dsn, "public", self.n, {"argv": ["true"]})
        run_pgqctl(
            env,
            "worker",
            "--concurrency",
            str(concurrency),
            "--burst",
            "--dsn",
            dsn,
            timeout=max(300.0, self.n / 20),
        )
        return (self.n - 1) / done_window(dsn, "public", self.n)

    def spawn_limit(self, env: Env, concurrency: int) -> float:
        config = {"n": self.n, "concurrency": concurrency, "barrier": False}
        _, (result,) = run_children("spawn_pool", [config], 300, barrier=False)
        return (int(result["done"]) - 1) / (float(result["last"]) - float(result["first"]))

    def seed_loop(self, env: Env, concurrency: int) -> float:
        dsn = env.dsns["pgqctl"]
        load_pgqctl_jobs(dsn, SEED_SCHEMA, self.n, {"argv": ["true"]})
        config = {"dsn": dsn, "schema": SEED_SCHEMA, "spawn": True, "barrier": False}
        run_children("drain_seed", [config] * concurrency, max(300.0, self.n / 20), barrier=False)
        return (self.n - 1) / done_window(dsn, SEED_SCHEMA, self.n)


# ----------------------------------------------------------------- latency


class Latency:
    """Enqueue-to-start through LISTEN/NOTIFY, one job at a time.

    Start is when the job's process runs: it writes the wall-clock time to a
    file (bash's $EPOCHREALTIME). The baseline is a plain listener that
    starts the same process on each notification, measured the same way.
    """

    name = "latency"
    ratios = (
        Ratio(
            "latency.p50.pgqctl/listen_notify", "latency.pgqctl.p50", "latency.listen_notify.p50"
        ),
        Ratio(
            "latency.p99.pgqctl/listen_notify", "latency.pgqctl.p99", "latency.listen_notify.p99"
        ),
    )
    CHANNEL = "bench_latency"

    def setup(self, env: Env, record: Record) -> None:
        self.n = env.sizes.latency_jobs
        record.note(
            f"latency: {self.n} jobs one at a time, 2-10 ms apart; pgqctl worker with "
            "--concurrency 1 --poll 5s; start = the job's process writing the time, the "
            "baseline's process is the same."
        )

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        contenders: dict[str, Callable[[Env], list[float]]] = {
            "pgqctl": self.pgqctl,
            "listen_notify": self.listen_notify,
        }
        for name in rotated(list(contenders), round_no):
            figure = f"{self.name}.{name}"

            def measure(name: str = name, figure: str = figure) -> None:
                seconds = contenders[name](env)
                for label, fraction in (("p50", 0.5), ("p99", 0.99)):
                    value = percentile(seconds, fraction) * 1000
                    record.add(f"{figure}.{label}", round_no, value, "ms", higher=False)

            attempt(record, figure, round_no, measure)
        if hasattr(self, "received"):
            median_ms = statistics.median(self.received) * 1000
            record.add("latency.notify_receive.p50", round_no, median_ms, "ms", higher=False)

    def pgqctl(self, env: Env) -> list[float]:
        env.require_command("worker")
        env.require_api("api")
        dsn = env.dsns["pgqctl"]
        truncate_all(dsn, "jobs")
        log = (env.tmp / "latency-worker.log").open("w")
        worker = subprocess.Popen(
            [env.pgqctl_bin, "worker", "--concurrency", "1", "--poll", "5s", "--dsn", dsn],
            stdout=log,
            stderr=log,
        )
        try:
            with connect(dsn) as conn:

                def send(path: Path) -> None:
                    pgqctl_adapter.enqueue(conn, "latency", {"argv": stamp_argv(str(path))})

                return self.measure(env, send, worker)
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
            log.close()

    def listen_notify(self, env: Env) -> list[float]:
        dsn = env.dsns["pgqctl"]
        child = Child("listen_spawn", {"dsn": dsn, "channel": self.CHANNEL})
        try:
            child.wait_ready()
            child.send("go")
            sent: list[float] = []
            with connect(dsn) as conn:

                def send(path: Path) -> None:
                    sent.append(time.time())
                    conn.execute("SELECT pg_notify(%s, %s)", (self.CHANNEL, str(path)))

                seconds = self.measure(env, send, child.proc)
                conn.execute("SELECT pg_notify(%s, 'stop')", (self.CHANNEL,))
            received = child.result(60)["received"]
            # The first notification is the warm-up.
            self.received = [r - s for r, s in zip(received[1:], sent[1:], strict=True)]
            return seconds
        finally:
            child.kill()

    def measure(
        self, env: Env, send: Callable[[Path], None], process: subprocess.Popen[Any]
    ) -> list[float]:
        """Send one job at a time and wait for its stamp; the first is a warm-up."""
        folder = env.tmp / f"stamps-{time.monotonic_ns()}"
        folder.mkdir()
        pace = random.Random(7)
        seconds = []
        for i in range(self.n + 1):
            path = folder / str(i)
            began = time.time()
            send(path)
            started = wait_for_stamp(path, process, timeout=30 if i else 120)
            if i:
                seconds.append(started - began)
            time.sleep(pace.uniform(0.002, 0.010))
        return seconds


def wait_for_stamp(path: Path, process: subprocess.Popen[Any], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return float(path.read_text())
        if process.poll() is not None:
            raise RuntimeError(f"the process serving {path.name} exited ({process.returncode})")
        time.sleep(0.0005)
    raise RuntimeError(f"job {path.name} did not start within {timeout:.0f} s")


# ----------------------------------------------------------------- history


class History:
    """Operator commands and the claim, with no finished rows and with many.

    Two schemas in one database hold the same live jobs, one of them with the
    finished history too; every call alternates between them, so a ratio
    compares calls made moments apart. Commands run in-process through
    pgqctl's entry point (connection included, interpreter start-up not).
    """

    name = "history"
    TABLES: ClassVar[dict[str, str]] = {"empty": "hist_empty", "full": "hist_full"}
    COMMANDS: ClassVar[dict[str, tuple[str, ...]]] = {
        "stats": ("stats", "--json"),
        "leases": ("leases", "--json"),
        "reap": ("reap", "--json"),
        "requeue_dry_run": ("requeue", "--dry-run", "--failed", "--json"),
        "list_failed": ("list", "--status", "failed", "--json"),
    }
    ratios = tuple(
        Ratio(f"history.{op}", f"history.{op}.full", f"history.{op}.empty", ("<=", 2))
        for op in (*COMMANDS, "claim")
    )

    def setup(self, env: Env, record: Record) -> None:
        dsn = env.dsns["history"]
        rows = env.sizes.history_rows
        record.note(
            f"history: {rows:,} finished rows against none; live set 1,000 pending, "
            "100 running (50 expired), 100 failed; median of "
            f"{env.sizes.history_calls} calls per round."
        )
        if rows < 1_000_000:
            record.note(f"history and purge use {rows:,} rows, not 1,000,000 (--quick).")
        say(f"  loading {rows:,} finished rows")
        self.expired: dict[str, list[int]] = {}
        for label, schema in self.TABLES.items():
            with connect(dsn, schema) as conn:
                conn.execute(LIVE_SET)
                if label == "full":
                    conn.execute(HISTORY, {"n": rows})
                conn.execute("VACUUM ANALYZE jobs")
                ids = conn.execute(
                    "SELECT id FROM jobs WHERE status = 'running' AND locked_until < now()"
                ).fetchall()
                self.expired[schema] = [row[0] for row in ids]

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        for op in rotated([*self.COMMANDS, "claim"], round_no):
            figure = f"{self.name}.{op}"

            def measure(op: str = op, figure: str = figure) -> None:
                for label, seconds in self.time_op(env, op).items():
                    record.add(f"{figure}.{label}", round_no, seconds * 1000, "ms", higher=False)

            attempt(record, figure, round_no, measure)

    def time_op(self, env: Env, op: str) -> dict[str, float]:
        dsn = env.dsns["history"]
        call: Callable[[str], None]
        if op == "claim":
            env.require_api("claims")

            def call(schema: str) -> None:
                with connect(dsn, schema) as conn, conn.transaction(force_rollback=True):
                    pgqctl_adapter.claim_once(conn, env.sizes.slots)
        else:
            args = self.COMMANDS[op]
            env.require_command(args[0])

            def call(schema: str) -> None:
                pgqctl_in_process(*args, "--dsn", dsn, "--schema", schema)

        timings: dict[str, list[float]] = {label: [] for label in self.TABLES}
        for i in range(env.sizes.history_calls):
            labels = list(self.TABLES) if i % 2 == 0 else list(reversed(self.TABLES))
            for label in labels:
                schema = self.TABLES[label]
                if op == "reap":
                    with connect(dsn, schema) as conn:
                        conn.execute(REEXPIRE, {"ids": self.expired[schema]})
                began = time.perf_counter()
                call(schema)
                timings[label].append(time.perf_counter() - began)
        return {label: statistics.median(values) for label, values in timings.items()}


# ------------------------------------------------------------------- purge


class Purge:
    """`pgqctl purge` of the finished history while workers claim and complete jobs."""

    name = "purge"
    SCHEMA = "purge"
    # What a worker sees: its slowest exchanges during the purge against the
    # same workers' in the quiet second before it.
    ratios = (
        Ratio(
            "purge.claim_p99_during/quiet",
            "purge.claim_p99_during",
            "purge.claim_p99_quiet",
            ("<=", 2),
        ),
        Ratio("purge.claim_stall/batch_time", "purge.claim_stall_max", "purge.batch_time"),
    )

    def setup(self, env: Env, record: Record) -> None:
        sizes = env.sizes
        path = "pgqctl" if "claims" not in env.missing_api else "seed"
        self.path = path
        record.note(
            f"purge: {sizes.purge_rows:,} finished rows, --batch-size {sizes.purge_batch}, run "
            f"in-process; {sizes.drain_workers} workers claim up to {sizes.slots} jobs, hold "
            "them 20 ms, complete them, and time every claim."
        )
        if path == "seed":
            record.note("purge: the workers used the seed's claim (pgqctl/claims.py missing).")

    def run_round(self, env: Env, record: Record, round_no: int) -> None:
        attempt(record, self.name, round_no, lambda: self.measure(env, record, round_no))

    def measure(self, env: Env, record: Record, round_no: int) -> None:
        env.require_command("purge")
        sizes = env.sizes
        dsn = env.dsns["history"]
        with connect(dsn, self.SCHEMA) as conn:
            conn.execute("TRUNCATE jobs RESTART IDENTITY")
            conn.execute(HISTORY, {"n": sizes.purge_rows})
            conn.execute(LOAD_JOBS, {"n": sizes.purge_pending, "payload": "{}"})
            conn.execute("VACUUM ANALYZE jobs")
        config = {
            "dsn": dsn,
            "schema": self.SCHEMA,
            "slots": sizes.slots,
            "hold": 0.02,
            "idle": 0.05,
            "path": self.path,
        }
        workers = [Child("purge_workers", config) for _ in range(sizes.drain_workers)]
        try:
            for worker in workers:
                worker.wait_ready()
            time.sleep(1.0)  # let the workers settle into their loop
            began = time.time()
            out = pgqctl_in_process(
                "purge",
                "--older-than",
                "0s",
                "--batch-size",
                str(sizes.purge_batch),
                "--json",
                "--dsn",
                dsn,
                "--schema",
                self.SCHEMA,
            )
            ended = time.time()
            time.sleep(0.3)
            for worker in workers:
                worker.send("stop")
            claims = [c for worker in workers for c in worker.result(60)["claims"]]
        finally:
            for worker in workers:
                worker.kill()
        deleted = int(json.loads(out)["deleted"])
        if deleted < sizes.purge_rows:
            raise RuntimeError(f"purge deleted {deleted} rows, expected {sizes.purge_rows}+")
        elapsed = ended - began
        during = [d for s, d in claims if s < ended and s + d > began]
        # The settling second before the purge: what the same workers see without it.
        quiet = [d for s, d in claims if began - 1.0 <= s and s + d <= began]
        batches = math.ceil(deleted / sizes.purge_batch)
        record.add("purge.rows_per_s", round_no, deleted / elapsed, "rows/s", higher=True)
        record.add("purge.batch_time", round_no, elapsed / batches * 1000, "ms", higher=False)
        record.add("purge.claim_stall_max", round_no, max(during) * 1000, "ms", higher=False)
        record.add(
            "purge.claim_p99_during", round_no, percentile(during, 0.99) * 1000, "ms", higher=False
        )
        if quiet:
            record.add("purge.claim_quiet_max", round_no, max(quiet) * 1000, "ms", higher=False)
            record.add(
                "purge.claim_p99_quiet",
                round_no,
                percentile(quiet, 0.99) * 1000,
                "ms",
                higher=False,
            )
            record.add(
                "purge.claim_quiet_p50",
                round_no,
                statistics.median(quiet) * 1000,
                "ms",
                higher=False,
            )


WORKLOADS = (BulkEnqueue, Drain, EndToEnd, Latency, History, Purge)
