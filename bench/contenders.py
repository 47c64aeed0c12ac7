"""The child processes of bench/compare.py: each contender's side of a workload.

Run as ``python contenders.py ACTION CONFIG_JSON``. A child first sets up
(imports, connections, input built in memory), prints ``ready``, waits for
``go`` on stdin, does its part, and prints one JSON line with what it measured.
Setup is never timed. Times are ``time.time()`` so the parent can compare them
across processes.

Every peer is driven the way its own documentation shows: pgqueuer through
``Queries.enqueue`` with lists and ``PgQueuer.run(mode=drain)`` under uvloop
(as ``pgq run`` does), procrastinate through ``Task.batch_defer_async`` and
``App.run_worker_async(wait=False)``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pgqctl_adapter
import psycopg
from shared_sql import SEED_CLAIM, SEED_DONE

# Writes the wall-clock time at which the job's process runs (microseconds);
# used by both sides of the latency workload, so its own cost cancels out.
STAMP_SCRIPT = 'printf "%s" "$EPOCHREALTIME" > "$1"'


# When each job's handler ran, in a peer's worker: a drain ends at the last
# one, so a peer's way of noticing the queue is empty is not counted.
HANDLED: list[float] = []


def stamp_argv(path: str) -> list[str]:
    return ["bash", "-c", STAMP_SCRIPT, "stamp", path]


# ------------------------------------------------------------------ protocol


def ready_then_go(cfg: dict[str, Any]) -> float:
    """Tell the parent setup is done, wait for its go; return the start time.

    With ``"barrier": false`` in the config the child starts at once.
    """
    if not cfg.get("barrier", True):
        return time.time()
    print("ready", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected go on stdin, got {line!r}")
    return time.time()


def report(**values: Any) -> None:
    print(json.dumps(values), flush=True)


def stop_requested() -> threading.Event:
    """An event set when the parent writes ``stop`` on stdin."""
    event = threading.Event()

    def wait() -> None:
        sys.stdin.readline()
        event.set()

    threading.Thread(target=wait, daemon=True).start()
    return event


def run_async(coro: Any, *, uvloop: bool = False) -> Any:
    if uvloop:
        import uvloop as loop_module

        return loop_module.run(coro)
    return asyncio.run(coro)


# -------------------------------------------------------------------- schema


def install_pgqueuer(cfg: dict[str, Any]) -> None:
    """pgqueuer's schema through its Python API (what `pgq install` runs)."""

    async def main() -> None:
        import pgqueuer

        queries = pgqueuer.Queries(await _pgqueuer_driver(cfg["dsn"], "asyncpg"))
        ready_then_go(cfg)
        await queries.install()
        report(installed=True)

    run_async(main(), uvloop=True)


def install_procrastinate(cfg: dict[str, Any]) -> None:
    """procrastinate's schema (what `procrastinate schema --apply` runs)."""

    async def main() -> None:
        app, _ = _procrastinate_app(cfg["dsn"])
        async with app.open_async():
            ready_then_go(cfg)
            await app.schema_manager.apply_schema_async()
            report(installed=True)

    run_async(main())


# ------------------------------------------------------------------- enqueue


def enqueue_pgqctl_api(cfg: dict[str, Any]) -> None:
    jobs = [{"kind": "bench", "payload": {"n": i}} for i in range(cfg["n"])]
    with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
        ready_then_go(cfg)
        began = time.time()
        ids = pgqctl_adapter.enqueue_many(conn, jobs)
        report(elapsed=time.time() - began, count=len(ids))


def enqueue_raw_copy(cfg: dict[str, Any]) -> None:
    """The database's own limit for the same jobs: one COPY of (kind, payload),
    each payload made JSON text inside the timed part, nothing returned."""
    payloads = [{"n": i} for i in range(cfg["n"])]
    with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
        ready_then_go(cfg)
        began = time.time()
        with conn.cursor() as cur, cur.copy("COPY jobs (kind, payload) FROM STDIN") as copy:
            for payload in payloads:
                copy.write_row(("bench", json.dumps(payload)))
        elapsed = time.time() - began
        count = conn.execute("SELECT count(*) FROM jobs").fetchone()
        report(elapsed=elapsed, count=count[0] if count else 0)


def _asyncpg_args(dsn: str) -> dict[str, Any]:
    """asyncpg takes URLs only: pass a libpq conninfo's parts as keywords."""
    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "dbname": "database"}
    args: dict[str, Any] = {new: parts[old] for old, new in names.items() if parts.get(old)}
    if parts.get("password"):
        args["password"] = parts["password"]
    return args


async def _pgqueuer_driver(dsn: str, driver: str) -> Any:
    import pgqueuer

    if driver == "asyncpg":
        import asyncpg

        return pgqueuer.AsyncpgDriver(await asyncpg.connect(**_asyncpg_args(dsn)))
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    return pgqueuer.PsycopgDriver(conn)


def enqueue_pgqueuer(cfg: dict[str, Any]) -> None:
    async def main() -> None:
        import pgqueuer

        queries = pgqueuer.Queries(await _pgqueuer_driver(cfg["dsn"], cfg["driver"]))
        n = cfg["n"]
        entrypoints = ["bench"] * n
        payloads: list[bytes | None] = [json.dumps({"n": i}).encode() for i in range(n)]
        priorities = [0] * n
        ready_then_go(cfg)
        began = time.time()
        ids = await queries.enqueue(entrypoints, payloads, priorities)
        report(elapsed=time.time() - began, count=len(ids))

    run_async(main(), uvloop=True)


def _procrastinate_app(dsn: str) -> tuple[Any, Any]:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop(n: int = 0) -> None:
        HANDLED.append(time.time())

    return app, noop


def enqueue_procrastinate(cfg: dict[str, Any]) -> None:
    async def main() -> None:
        app, noop = _procrastinate_app(cfg["dsn"])
        task_kwargs = [{"n": i} for i in range(cfg["n"])]
        async with app.open_async():
            ready_then_go(cfg)
            began = time.time()
            ids = await noop.batch_defer_async(*task_kwargs)
            report(elapsed=time.time() - began, count=len(ids))

    run_async(main())


# --------------------------------------------------------------------- drain


def drain_pgqctl(cfg: dict[str, Any]) -> None:
    """pgqctl's own claim-and-complete functions, no child process per job."""
    with pgqctl_adapter.WorkerPath(
        cfg["dsn"], slots=cfg["slots"], prefetch=cfg.get("prefetch", 0)
    ) as path:
        last = ready_then_go(cfg)
        jobs = path.exchange([])
        done = 0
        while jobs:
            # Reports this batch done and claims the next, in one round trip.
            done += len(jobs)
            jobs = path.exchange(jobs)
            last = time.time()
        report(end=last, done=done)


def drain_seed(cfg: dict[str, Any]) -> None:
    """The seed's loop: one claim, optionally run `true`, one fenced update."""
    spawn = cfg.get("spawn", False)
    with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', %s, false)", (cfg["schema"],))
        claim = conn.cursor()
        finish = conn.cursor()
        last = ready_then_go(cfg)
        done = 0
        while row := claim.execute(SEED_CLAIM).fetchone():
            if spawn:
                subprocess.run(["true"], check=False)
            finish.execute(SEED_DONE, (row[0], row[3]))
            done += 1
            last = time.time()
        report(end=last, done=done)


def drain_pgqueuer(cfg: dict[str, Any]) -> None:
    async def main() -> None:
        import pgqueuer
        from pgqueuer.types import QueueExecutionMode

        manager = pgqueuer.PgQueuer(await _pgqueuer_driver(cfg["dsn"], cfg["driver"]))

        @manager.entrypoint("bench")
        async def bench(job: Any) -> None:
            HANDLED.append(time.time())

        ready_then_go(cfg)
        await manager.run(batch_size=cfg["slots"], mode=QueueExecutionMode.drain)
        report(end=max(HANDLED, default=time.time()), done=len(HANDLED))

    run_async(main(), uvloop=True)


def drain_procrastinate(cfg: dict[str, Any]) -> None:
    async def main() -> None:
        app, _ = _procrastinate_app(cfg["dsn"])
        async with app.open_async():
            ready_then_go(cfg)
            await app.run_worker_async(
                concurrency=cfg["slots"], wait=False, install_signal_handlers=False
            )
            report(end=max(HANDLED, default=time.time()), done=len(HANDLED))

    run_async(main())


# ---------------------------------------------------------------- end to end


def spawn_pool(cfg: dict[str, Any]) -> None:
    """The spawn limit: threads running `true`, as many at once as the worker would.

    Reports the first and last completion, the window a queue's steady rate is
    measured over too.
    """
    remaining = cfg["n"]
    lock = threading.Lock()
    finished: list[float] = []

    def take() -> bool:
        nonlocal remaining
        with lock:
            remaining -= 1
            return remaining >= 0

    def loop() -> None:
        while take():
            subprocess.run(["true"], check=False)
            finished.append(time.time())  # list.append is atomic

    ready_then_go(cfg)
    threads = [threading.Thread(target=loop) for _ in range(cfg["concurrency"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report(first=min(finished), last=max(finished), done=len(finished))


# ------------------------------------------------------------------- latency


def listen_spawn(cfg: dict[str, Any]) -> None:
    """The LISTEN/NOTIFY baseline: on each notification, start the stamp process.

    The notification's payload is the stamp file's path; ``stop`` ends the loop.
    """
    with psycopg.connect(cfg["dsn"], autocommit=True) as conn:
        conn.execute(f"LISTEN {cfg['channel']}")
        ready_then_go(cfg)
        received: list[float] = []
        for note in conn.notifies():
            if note.payload == "stop":
                break
            received.append(time.time())
            subprocess.run(stamp_argv(note.payload), check=False)
        report(received=received)


# --------------------------------------------------------------------- purge


class SeedPath:
    """The seed's report and claim with WorkerPath's shape (one job per claim)."""

    def __init__(self, dsn: str, *, slots: int, schema: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("SELECT set_config('search_path', %s, false)", (schema,))

    def exchange(self, done: list[Any]) -> list[Any]:
        for job in done:
            self.conn.execute(SEED_DONE, (job[0], job[3]))
        row = self.conn.execute(SEED_CLAIM).fetchone()
        return [row] if row else []

    def __enter__(self) -> SeedPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def purge_workers(cfg: dict[str, Any]) -> None:
    """Claims under a running purge: log how long every claim took.

    Each exchange reports the last batch and claims the next, as the worker
    does; it holds each batch ``hold`` seconds (the jobs' run time) and sleeps
    ``idle`` seconds after an empty claim, as a waiting worker would. On
    ``stop`` it reports the exchanges as (start, seconds) pairs. ``path`` is
    ``pgqctl`` (the worker's functions) or ``seed`` (the seed's SQL).
    """
    stop = stop_requested()
    claims: list[tuple[float, float]] = []
    kind = pgqctl_adapter.WorkerPath if cfg["path"] == "pgqctl" else SeedPath
    with kind(cfg["dsn"], slots=cfg["slots"], schema=cfg["schema"]) as path:
        print("ready", flush=True)
        jobs: list[Any] = []
        while not stop.is_set():
            began = time.time()
            jobs = path.exchange(jobs)
            claims.append((began, time.time() - began))
            time.sleep(cfg["hold"] if jobs else cfg["idle"])
    report(claims=claims)


ACTIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "install_pgqueuer": install_pgqueuer,
    "install_procrastinate": install_procrastinate,
    "enqueue_pgqctl_api": enqueue_pgqctl_api,
    "enqueue_raw_copy": enqueue_raw_copy,
    "enqueue_pgqueuer": enqueue_pgqueuer,
    "enqueue_procrastinate": enqueue_procrastinate,
    "drain_pgqctl": drain_pgqctl,
    "drain_seed": drain_seed,
    "drain_pgqueuer": drain_pgqueuer,
    "drain_procrastinate": drain_procrastinate,
    "spawn_pool": spawn_pool,
    "listen_spawn": listen_spawn,
    "purge_workers": purge_workers,
}


if __name__ == "__main__":
    ACTIONS[sys.argv[1]](json.loads(sys.argv[2]))
