"""What `pgqctl worker` costs, against peers measured in the same run.

    python bench/worker_bench.py [--dsn DSN] [--rounds 3] [--quick]

DSN: --dsn, else PGQCTL_TEST_DSN, else an embedded PostgreSQL in a temporary
data directory of its own (stopped and removed at the end). The bench creates
a database of its own there and drops it at the end. Several measures, each
over several rounds; a ratio is computed within a round (both sides measured
back to back) and its median quoted, because these machines drift between
rounds:

- e2e: `pgqctl worker --concurrency 4 --burst` as a subprocess draining jobs
  whose command is `true`, from its first job start to the last finished_at,
  against a pool of 4 threads running subprocess.run(["true"]) with no queue.
  Also CPU per job, which the machine's other tenants disturb less than
  rates: the pool's (its threads and the `true` children), the worker's
  (process and children, start-up included) and, when the server runs on
  this machine, PostgreSQL's (every postgres process, so other databases'
  work counts too). On a saturated machine, pool CPU / (worker + server CPU)
  is about the best throughput ratio the worker could reach.
- figures: the ratios the performance issue names, all sides in every
  round: `true` at concurrency 4, the worker against the bare loop (both
  claiming only for free slots), `--prefetch 4` against the bare loop 4
  ahead and against the pool; `sleep 0.01` x 2,000 at concurrency 8 and
  `sleep 0.1` x 500 at concurrency 16, the worker without prefetch against
  the pool; the bare loop on the `sleep 0.01` jobs too, watching its
  children during each exchange and waiting for each answer as the worker
  does, with what 0.95x the pool leaves a slot between two jobs against the
  bare loop's exchange; CPU per job of each process outside its children
  and of the server backends of its connections (see figures_rounds).
- claims: the worker's own claims.py path (each process claims up to 4 jobs
  and reports the previous batch in the same statement, as the worker does
  with 4 slots), 4 processes, against the classic loop (claim LIMIT 1, then
  one fenced update per job) with 4 processes; each way drains 20,000 jobs
  or stops after 15 s.
- bare: bench/bare_loop.py, the barest loop that claims the way the worker
  must (one exchange per refill, claiming only for free slots), against the
  same pool: the most any Python worker under that rule could reach here;
  and the same loop claiming 4 jobs ahead of its free slots, to show what
  the rule costs. CPU per job of each (loop and children; server).
- latency: an idle worker with --poll 5s; jobs enqueued one at a time, 20-50
  ms apart; latency from the enqueue's commit to the worker starting the job
  (its `started` log line).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import throwaway_db
from bare_loop import BareLoop
from shared_sql import SEED_CLAIM, SEED_DONE

from pgqctl import claims, db
from pgqctl.jobs import Held

SLOTS = 4
LEASE = 300.0
POLL = 5.0
# The claims measure of each way stops after this long, drained or not.
CLAIMS_SECONDS = 15.0


# ------------------------------------------------------------------ setup


def fill(dsn: str, count: int, payload: object) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        conn.execute(
            "INSERT INTO jobs (kind, payload) "
            "SELECT 'bench', %s::jsonb FROM generate_series(1, %s)",
            (json.dumps(payload), count),
        )
        conn.execute("VACUUM ANALYZE jobs")


def worker_command(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--log-format", "json", *args]


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    found = []
    with path.open() as f:
        for line in f:
            record = json.loads(line)
            if record["event"] == event:
                found.append(record)
    return found


def epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------- end to end


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def server_cpu_seconds() -> float | None:
    """CPU of every postgres process on this machine, ended backends included
    (the postmaster's children), or None if there is none to read."""
    total, found = 0, False
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                name, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        if name.endswith("(postgres"):
            fields = rest.split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
            found = True
    return total / os.sysconf("SC_CLK_TCK") if found else None


# CPU microseconds per job of the last run of each e2e way, by name.
E2E_CPU: dict[str, list[float]] = {"pool": [], "worker": [], "server": []}


def spawn_pool(count: int) -> float:
    """Jobs/s of 4 threads running subprocess.run(["true"]), `count` runs in all."""
    left = [count]
    lock = threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            subprocess.run(["true"], check=False)

    threads = [threading.Thread(target=loop) for _ in range(SLOTS)]
    cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
    E2E_CPU["pool"].append(cpu / count * 1e6)
    return count / elapsed


def worker_drain(dsn: str, count: int, workdir: Path) -> float:
    """Jobs/s of one burst worker with 4 slots: first job start to last finished_at."""
    fill(dsn, count, {"argv": ["true"]})
    log = workdir / "e2e.log"
    cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
    server = server_cpu_seconds()
    with log.open("w") as err:
        code = subprocess.call(
            worker_command(dsn, "--concurrency", str(SLOTS), "--burst"),
            stderr=err,
            stdout=subprocess.DEVNULL,
        )
    # The worker has exited, so its backends have too: the postmaster holds their CPU.
    server_after = server_cpu_seconds()
    E2E_CPU["worker"].append((cpu_seconds(resource.RUSAGE_CHILDREN) - cpu) / count * 1e6)
    if server is not None and server_after is not None:
        E2E_CPU["server"].append((server_after - server) / count * 1e6)
    assert code == 0, log.read_text()[-2000:]
    first = epoch(log_events(log, "started")[0]["ts"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), "
            "extract(epoch FROM max(finished_at)) FROM jobs"
        ).fetchone()
    assert row is not None and row[0] == count, f"only {row} done"
    return count / (float(row[1]) - first)


def bare_drain(dsn: str, count: int, ahead: int) -> float:
    """Jobs/s of bench/bare_loop.py with 4 slots; its CPU and the server's per job."""
    fill(dsn, count, {"argv": ["true"]})
    loop = BareLoop(dsn, SLOTS, ahead)
    try:
        cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)
        server = server_cpu_seconds()
        rate: float = loop.run()
        cpu = cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN) - cpu
        server_after = server_cpu_seconds()
    finally:
        loop.close()
    BARE_CPU[ahead].append(cpu / count * 1e6)
    if server is not None and server_after is not None:
        BARE_SERVER_CPU[ahead].append((server_after - server) / count * 1e6)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone()
    assert row == (0,), f"{row} jobs not done"
    return rate


# CPU microseconds per job of the bare loop's runs, by jobs claimed ahead: its
# own and its children's, and the server's.
BARE_CPU: dict[int, list[float]] = {0: [], 4: []}
BARE_SERVER_CPU: dict[int, list[float]] = {0: [], 4: []}


# ----------------------------------------------- prefetch and real work
#
# Item 2 of the performance issue, measured in one run: the worker (as a
# user runs it: a subprocess, its own log) against the bare loop under the
# same claiming rule, with and without claiming 4 ahead (`--prefetch 4`),
# against a thread pool with no database, on `true` jobs at concurrency 4;
# and on jobs that do real work (`sleep`) without prefetch against the pool.
# Each side drains jobs inserted in one statement into an empty table while
# it waits idle, so that neither start-up nor connecting is counted in its
# CPU: the worker's process is read from /proc/<pid>/stat (utime and stime:
# every thread, without its children) just before the insert and once every
# job is done, while it still runs; the server's CPU is that of the backends
# of its connections, read the same way (the WAL writer and other shared
# processes are left out: other databases on the server would count there).


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own, children's) CPU seconds of a live process, from /proc/<pid>/stat."""
    user, system, children = proc_times(pid)
    return user + system, children


def proc_times(pid: int) -> tuple[float, float, float]:
    """(user, system, children's) CPU seconds of a live process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (
        int(fields[11]) / ticks,
        int(fields[12]) / ticks,
        (int(fields[13]) + int(fields[14])) / ticks,
    )


def backends_cpu(pids: list[int]) -> float | None:
    """CPU seconds of these server backends, None if they cannot be read (another machine)."""
    try:
        return sum(proc_cpu(pid)[0] for pid in pids)
    except OSError:
        return None


def insert_jobs(dsn: str, count: int, argv: list[str]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (kind, payload) "
            "SELECT 'bench', %s::jsonb FROM generate_series(1, %s)",
            (json.dumps({"argv": argv}), count),
        )


@dataclass
class Drained:
    """One side's run: jobs/s, and CPU microseconds per job (None: not read)."""

    rate: float
    own: float  # the process itself, without its children
    children: float | None
    server: float | None
    own_user: float | None = None  # of `own`, the time in user mode (Python, libpq)
    exchange_ms: float | None = None  # the median exchange, send to whole answer (bare loop)


def pool_run(count: int, argv: list[str], threads: int) -> Drained:
    """`threads` threads running subprocess.run(argv), `count` runs in all, no database."""
    left = [count]
    lock = threading.Lock()

    def loop() -> None:
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            subprocess.run(argv, check=False)

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    own = cpu_seconds(resource.RUSAGE_SELF)
    children = cpu_seconds(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - started
    own = cpu_seconds(resource.RUSAGE_SELF) - own
    children = cpu_seconds(resource.RUSAGE_CHILDREN) - children
    return Drained(count / elapsed, own / count * 1e6, children / count * 1e6, None)


def worker_run(
    dsn: str, count: int, argv: list[str], concurrency: int, prefetch: int, workdir: Path
) -> Drained:
    """A `pgqctl worker` waiting idle drains `count` jobs inserted at once:
    jobs/s from its first job start to the last finished_at."""
    fill(dsn, 0, {})
    log = workdir / f"figures-{concurrency}-{prefetch}.log"
    args = ["--concurrency", str(concurrency), "--prefetch", str(prefetch), "--poll", f"{POLL}s"]
    with log.open("w") as err:
        worker = subprocess.Popen(worker_command(dsn, *args), stderr=err, stdout=subprocess.DEVNULL)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _wait_listening(conn)
            backends = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'pgqctl worker %%'"
                )
            ]
            user, system, children = proc_times(worker.pid)
            server = backends_cpu(backends)
            insert_jobs(dsn, count, argv)
            deadline = time.monotonic() + 600
            while conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone() != (
                count,
            ):
                assert time.monotonic() < deadline, "jobs left undone"
                assert worker.poll() is None, log.read_text()[-2000:]
                time.sleep(0.05)
            user_after, system_after, children_after = proc_times(worker.pid)
            server_after = backends_cpu(backends)
            row = conn.execute("SELECT extract(epoch FROM max(finished_at)) FROM jobs").fetchone()
    finally:
        worker.terminate()
        worker.wait()
    assert row is not None
    first = epoch(log_events(log, "started")[0]["ts"])
    return Drained(
        count / (float(row[0]) - first),
        (user_after + system_after - user - system) / count * 1e6,
        (children_after - children) / count * 1e6,
        None if server is None or server_after is None else (server_after - server) / count * 1e6,
        (user_after - user) / count * 1e6,
    )


def bare_run(
    dsn: str,
    count: int,
    ahead: int,
    argv: list[str] | None = None,
    slots: int = SLOTS,
    *,
    overlap: bool = True,
) -> Drained:
    """bench/bare_loop.py with `slots` slots, claiming `ahead` jobs ahead
    (watching its children during each exchange unless not `overlap`),
    drains `count` jobs of `argv` (`true`) inserted once it is connected."""
    fill(dsn, 0, {})
    loop = BareLoop(dsn, slots, ahead, overlap=overlap)
    try:
        backend = [loop.conn.info.backend_pid]
        insert_jobs(dsn, count, argv or ["true"])
        before = resource.getrusage(resource.RUSAGE_SELF)
        children = cpu_seconds(resource.RUSAGE_CHILDREN)
        server = backends_cpu(backend)
        rate = loop.run()
        after = resource.getrusage(resource.RUSAGE_SELF)
        children = cpu_seconds(resource.RUSAGE_CHILDREN) - children
        server_after = backends_cpu(backend)
        user = after.ru_utime - before.ru_utime
        own = user + after.ru_stime - before.ru_stime
    finally:
        loop.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone()
    assert row == (0,), f"{row} jobs not done"
    return Drained(
        rate,
        own / count * 1e6,
        children / count * 1e6,
        None if server is None or server_after is None else (server_after - server) / count * 1e6,
        user / count * 1e6,
        statistics.median(loop.exchanges) * 1e3,
    )


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def show_ratio(name: str, ratios: list[float], target: str) -> None:
    """A ratio over the rounds, with its target and whether the median meets it."""
    med = statistics.median(ratios)
    verdict = ""
    if target:
        bound = float(target[2:])
        met = med >= bound if target.startswith(">=") else med <= bound
        verdict = f"  [target {target}: {'met' if met else 'not met'}]"
    print(
        f"ratio {name}: {med:.2f} x (median of {len(ratios)}; min {min(ratios):.2f}, "
        f"max {max(ratios):.2f}){verdict}"
    )


def figures_rounds(dsn: str, rounds: int, jobs: int, workdir: Path, quick: bool) -> None:
    """The ratios of item 2, every side measured in each round, in an order
    that rotates from round to round."""
    sleep_short, sleep_long = (500, 125) if quick else (2000, 500)
    true = ["true"]
    ways: dict[str, Callable[[], Drained]] = {
        "worker": lambda: worker_run(dsn, jobs, true, SLOTS, 0, workdir),
        "worker_prefetch_4": lambda: worker_run(dsn, jobs, true, SLOTS, 4, workdir),
        "bare_loop": lambda: bare_run(dsn, jobs, 0),
        "bare_loop_4_ahead": lambda: bare_run(dsn, jobs, 4),
        "pool": lambda: pool_run(jobs, true, SLOTS),
        "worker_sleep_0.01_c8": lambda: worker_run(
            dsn, sleep_short, ["sleep", "0.01"], 8, 0, workdir
        ),
        "pool_sleep_0.01_c8": lambda: pool_run(sleep_short, ["sleep", "0.01"], 8),
        # Not targets: the most a loop under the claiming rule reaches on the
        # same jobs, watching its children during each exchange or not.
        "bare_loop_sleep_0.01_c8": lambda: bare_run(dsn, sleep_short, 0, ["sleep", "0.01"], 8),
        "bare_loop_waiting_sleep_0.01_c8": lambda: bare_run(
            dsn, sleep_short, 0, ["sleep", "0.01"], 8, overlap=False
        ),
        # Not a target: what --prefetch does for the same real work.
        "worker_prefetch_8_sleep_0.01_c8": lambda: worker_run(
            dsn, sleep_short, ["sleep", "0.01"], 8, 8, workdir
        ),
        "worker_sleep_0.1_c16": lambda: worker_run(
            dsn, sleep_long, ["sleep", "0.1"], 16, 0, workdir
        ),
        "pool_sleep_0.1_c16": lambda: pool_run(sleep_long, ["sleep", "0.1"], 16),
    }
    runs: dict[str, list[Drained]] = {name: [] for name in ways}
    names = list(ways)
    print(f"load before: {load()} (1, 5, 15 min)")
    for n in range(rounds):
        shift = n % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(ways[name]())
        print(f"round {n + 1} of {rounds} done, load {load()}", file=sys.stderr)
    print(f"load after: {load()} (1, 5, 15 min)")
    print(
        f"figures: `true` x {jobs} at concurrency {SLOTS}; `sleep 0.01` x {sleep_short} at "
        f"concurrency 8; `sleep 0.1` x {sleep_long} at concurrency 16; {rounds} rounds"
    )
    for name, found in runs.items():
        show(name, [d.rate for d in found], "jobs/s")

    def ratios(mine: str, base: str) -> list[float]:
        return [a.rate / b.rate for a, b in zip(runs[mine], runs[base], strict=True)]

    show_ratio("worker/bare_loop (true, c4)", ratios("worker", "bare_loop"), ">=0.9")
    show_ratio(
        "worker_prefetch_4/bare_loop_4_ahead (true, c4)",
        ratios("worker_prefetch_4", "bare_loop_4_ahead"),
        ">=0.9",
    )
    show_ratio("worker_prefetch_4/pool (true, c4)", ratios("worker_prefetch_4", "pool"), ">=0.75")
    show_ratio("worker/pool (true, c4)", ratios("worker", "pool"), "")
    show_ratio(
        "worker/pool (sleep 0.01, c8)",
        ratios("worker_sleep_0.01_c8", "pool_sleep_0.01_c8"),
        ">=0.95",
    )
    show_ratio(
        "worker_prefetch_8/pool (sleep 0.01, c8)",
        ratios("worker_prefetch_8_sleep_0.01_c8", "pool_sleep_0.01_c8"),
        "",
    )
    show_ratio(
        "bare_loop/pool (sleep 0.01, c8)",
        ratios("bare_loop_sleep_0.01_c8", "pool_sleep_0.01_c8"),
        "",
    )
    show_ratio(
        "bare_loop_waiting/bare_loop (sleep 0.01, c8)",
        ratios("bare_loop_waiting_sleep_0.01_c8", "bare_loop_sleep_0.01_c8"),
        "",
    )
    show_refill(runs["pool_sleep_0.01_c8"], runs["bare_loop_waiting_sleep_0.01_c8"], 8)
    show_ratio(
        "worker/pool (sleep 0.1, c16)",
        ratios("worker_sleep_0.1_c16", "pool_sleep_0.1_c16"),
        ">=0.95",
    )
    for name in ("worker", "worker_prefetch_4", "bare_loop", "bare_loop_4_ahead", "pool"):
        show(f"cpu_own {name} (true)", [d.own for d in runs[name]], "us/job")
        children = [d.children for d in runs[name] if d.children is not None]
        if children:
            show(f"cpu_children {name} (true)", children, "us/job")
        server = [d.server for d in runs[name] if d.server is not None]
        if server:
            show(f"cpu_server {name} (true)", server, "us/job")
    for name in ("worker", "worker_prefetch_4", "bare_loop", "bare_loop_4_ahead"):
        user = [d.own_user for d in runs[name] if d.own_user is not None]
        if user:
            show(f"cpu_own_user {name} (true)", user, "us/job")
    for mine, base in (("worker", "bare_loop"), ("worker_prefetch_4", "bare_loop_4_ahead")):
        show_ratio(
            f"cpu_own {mine}/{base} (true)",
            [a.own / b.own for a, b in zip(runs[mine], runs[base], strict=True)],
            "<=1.5",
        )
        show_path(mine, base, runs[mine], runs[base])


def show_refill(pool: list[Drained], bare: list[Drained], slots: int) -> None:
    """What 0.95x the pool leaves a worker per job: the pool's slot runs
    job after job with nothing between, so a worker's slot may spend 1/0.95 - 1
    of that cycle between one job's end and the next one's start; under the
    claiming rule that gap holds at least one exchange. `bare`: the bare loop
    that waits for each answer, so that its exchanges are the round trip alone."""
    cycles = [slots / p.rate * 1e3 for p in pool]
    show(f"path pool cycle (sleep 0.01, c{slots})", cycles, "ms/job per slot", 2)
    show(
        f"path refill allowed for 0.95x pool (sleep 0.01, c{slots})",
        [c / 0.95 - c for c in cycles],
        "ms at most",
        2,
    )
    exchanges = [b.exchange_ms for b in bare if b.exchange_ms is not None]
    show(f"path exchange bare_loop_waiting (sleep 0.01, c{slots})", exchanges, "ms (median)", 2)


def show_path(mine: str, base: str, mine_runs: list[Drained], base_runs: list[Drained]) -> None:
    """Why a drain of `true` runs at the rate it does: both sides start their
    children from one thread, which waits, holding the GIL, while each child
    execs (os.posix_spawn), and for each exchange's answer. So a job costs
    that thread its own CPU, the server's CPU of the exchange, and the wait
    for the exec. The wait is the base's interval less its two CPUs; with the
    same wait, the other side's two CPUs give its rate. A ratio the model
    predicts close to the measured one says the gap is the CPU per job."""
    waits, predicted, needed = [], [], []
    for a, b in zip(mine_runs, base_runs, strict=True):
        if a.server is None or b.server is None:
            return
        wait = 1e6 / b.rate - b.own - b.server
        waits.append(wait)
        predicted.append((b.own + b.server + wait) / (a.own + a.server + wait))
        # What own + server CPU would give 0.9x the base at the same wait.
        needed.append((1e6 / b.rate) / 0.9 - wait)
    show(f"path exec_wait {base} (true)", waits, "us/job")
    show(
        f"path own+server {mine} for 0.9x {base} (true)",
        needed,
        f"us/job at most (now {statistics.median(a.own + (a.server or 0) for a in mine_runs):.0f})",
    )
    show_ratio(f"predicted {mine}/{base} (true), from CPU per job", predicted, "")


# ------------------------------------------------------------ claims path


def _claims_child(dsn: str, batched: bool, go: Any, done: Any) -> None:
    with db.connect(dsn, schema="public") as conn:
        go.wait()
        until = time.monotonic() + CLAIMS_SECONDS
        count = _drain_batched(conn, until) if batched else _drain_seed(conn, until)
    done.put((count, time.monotonic()))


def _drain_batched(conn: psycopg.Connection[Any], until: float) -> int:
    held: list[Held] = []
    count = 0
    while True:
        claim = SLOTS if time.monotonic() < until else 0
        changed = claims.exchange(conn, done=held, claim=claim, lease=LEASE, worker="bench")
        count += len(changed.done)
        held = [job.held for job in changed.claimed]
        if not held:
            return count


def _drain_seed(conn: psycopg.Connection[Any], until: float) -> int:
    count = 0
    while time.monotonic() < until:
        row = conn.execute(SEED_CLAIM).fetchone()
        if row is None:
            break
        conn.execute(SEED_DONE, (row[0], row[3])).fetchone()
        count += 1
    return count


def claims_drain(dsn: str, count: int, batched: bool) -> float:
    """Jobs/s of 4 processes claiming and completing up to `count` jobs, running
    nothing; each stops after CLAIMS_SECONDS (slow disks make the classic loop slow)."""
    fill(dsn, count, {})
    context = multiprocessing.get_context("fork")
    go, done = context.Event(), context.Queue()
    procs = [
        context.Process(target=_claims_child, args=(dsn, batched, go, done)) for _ in range(SLOTS)
    ]
    for proc in procs:
        proc.start()
    time.sleep(0.3)  # let them connect
    started = time.monotonic()
    go.set()
    results = [done.get() for _ in procs]
    for proc in procs:
        proc.join()
    drained = sum(n for n, _ in results)
    assert drained > 0, "nothing drained"
    return drained / (max(end for _, end in results) - started)


# ---------------------------------------------------------------- latency


def pickup_latencies(dsn: str, count: int, workdir: Path) -> list[float]:
    """Seconds from each enqueue's commit to the idle worker starting that job."""
    fill(dsn, 0, {})
    log = workdir / "latency.log"
    with log.open("w") as err:
        worker = subprocess.Popen(
            worker_command(dsn, "--concurrency", str(SLOTS), "--poll", f"{POLL}s"),
            stderr=err,
            stdout=subprocess.DEVNULL,
        )
    committed: dict[int, float] = {}
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            _wait_listening(conn)
            for _ in range(count):
                time.sleep(random.uniform(0.020, 0.050))
                row = conn.execute(
                    "INSERT INTO jobs (kind, payload) VALUES ('bench', '{\"argv\": [\"true\"]}') "
                    "RETURNING id"
                ).fetchone()
                assert row is not None
                committed[row[0]] = time.time()
            deadline = time.monotonic() + 30
            while conn.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone() != (
                0,
            ):
                assert time.monotonic() < deadline, "jobs left undone"
                time.sleep(0.05)
    finally:
        worker.terminate()
        worker.wait()
    started = {e["job_id"]: epoch(e["ts"]) for e in log_events(log, "started")}
    return [started[job_id] - at for job_id, at in committed.items()]


def _wait_listening(conn: psycopg.Connection[Any]) -> None:
    deadline = time.monotonic() + 10
    while not conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND query = 'LISTEN pgqctl_jobs'"
    ).fetchone():
        assert time.monotonic() < deadline, "the worker never listened"
        time.sleep(0.05)
    time.sleep(0.5)  # past its first (empty) claim: idle


# ---------------------------------------------------------------- report


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def show(name: str, values: list[float], unit: str, digits: int = 0) -> None:
    med, low, high = statistics.median(values), min(values), max(values)
    print(
        f"{name}: {med:.{digits}f} {unit} (median of {len(values)}; "
        f"min {low:.{digits}f}, max {high:.{digits}f})"
    )


def paired(
    rounds: int, mine: Callable[[], float], base: Callable[[], float]
) -> tuple[list[float], list[float], list[float]]:
    """Each round measures both back to back (base first every other round);
    returns mine, base, and the per-round ratios mine/base."""
    ours: list[float] = []
    theirs: list[float] = []
    for n in range(rounds):
        if n % 2:
            ours.append(mine())
            theirs.append(base())
        else:
            theirs.append(base())
            ours.append(mine())
    return ours, theirs, [a / b for a, b in zip(ours, theirs, strict=True)]


def bare_rounds(dsn: str, rounds: int, jobs: int) -> None:
    pools: list[float] = []
    rates: dict[int, list[float]] = {0: [], 4: []}
    ways: list[int | None] = [0, 4, None]  # jobs claimed ahead; None: the pool
    for n in range(rounds):
        for ahead in ways if n % 2 else reversed(ways):
            if ahead is None:
                pools.append(spawn_pool(jobs))
            else:
                rates[ahead].append(bare_drain(dsn, jobs, ahead))
    print(f"bare_jobs: {jobs} jobs per round, 4 slots")
    show("spawn_pool_4_threads", pools, "jobs/s")
    for ahead, label in ((0, "bare_loop_free_slots"), (4, "bare_loop_4_ahead")):
        show(label, rates[ahead], "jobs/s")
        show(
            f"ratio {label}/spawn_pool",
            [b / p for b, p in zip(rates[ahead], pools, strict=True)],
            "x",
            2,
        )
        show(f"cpu_{label}", BARE_CPU[ahead], "us/job")
        if BARE_SERVER_CPU[ahead]:
            show(f"cpu_server_{label}", BARE_SERVER_CPU[ahead], "us/job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="admin DSN (default: PGQCTL_TEST_DSN, else embedded)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer jobs per round")
    parser.add_argument(
        "--only", choices=("e2e", "bare", "figures", "claims", "latency"), action="append"
    )
    args = parser.parse_args()
    only = set(args.only or ("e2e", "bare", "figures", "claims", "latency"))
    e2e_jobs, claim_jobs, latency_jobs = (1000, 5000, 50) if args.quick else (4000, 20000, 200)

    with (
        throwaway_db.server(args.dsn) as admin,
        throwaway_db.database(admin) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-bench-") as tmp,
    ):
        workdir = Path(tmp)
        print(f"cpus: {os.cpu_count()} cores")
        with psycopg.connect(dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
        print(
            f"server: PostgreSQL {version[0] if version else '?'}, "
            f"synchronous_commit {sync[0] if sync else '?'}"
        )
        spawn_pool(200)  # warm up
        E2E_CPU["pool"].clear()
        if "e2e" in only:
            worker, pool, ratio = paired(
                args.rounds,
                lambda: worker_drain(dsn, e2e_jobs, workdir),
                lambda: spawn_pool(e2e_jobs),
            )
            print(f"e2e_jobs: {e2e_jobs} jobs per round")
            show("spawn_pool_4_threads", pool, "jobs/s")
            show("worker_concurrency_4", worker, "jobs/s")
            show("ratio worker/spawn_pool", ratio, "x", 2)
            show("cpu_spawn_pool", E2E_CPU["pool"], "us/job")
            show("cpu_worker_and_children", E2E_CPU["worker"], "us/job")
            if E2E_CPU["server"]:
                show("cpu_server", E2E_CPU["server"], "us/job")
                bound = [
                    p / (w + s)
                    for p, w, s in zip(
                        E2E_CPU["pool"], E2E_CPU["worker"], E2E_CPU["server"], strict=True
                    )
                ]
                show("cpu ratio spawn_pool/(worker+server)", bound, "x", 2)
        if "bare" in only:
            bare_rounds(dsn, args.rounds, e2e_jobs)
        if "figures" in only:
            figures_rounds(dsn, args.rounds, e2e_jobs, workdir, args.quick)
        if "claims" in only:
            batched, seed, ratio = paired(
                args.rounds,
                lambda: claims_drain(dsn, claim_jobs, batched=True),
                lambda: claims_drain(dsn, claim_jobs, batched=False),
            )
            print(f"claims_jobs: {claim_jobs} jobs per round, 4 processes")
            show("claims_batched", batched, "jobs/s")
            show("claims_seed_loop", seed, "jobs/s")
            show("ratio batched/seed", ratio, "x", 2)
        if "latency" in only:
            medians, p99s = [], []
            for _ in range(args.rounds):
                latencies = pickup_latencies(dsn, latency_jobs, workdir)
                medians.append(statistics.median(latencies) * 1000)
                p99s.append(percentile(latencies, 0.99) * 1000)
            print(f"latency_jobs: {latency_jobs} jobs per round, poll {POLL:g}s")
            show("latency_median", medians, "ms", 1)
            show("latency_p99", p99s, "ms", 1)
            show("latency_median_of_poll", [m / (POLL * 10) for m in medians], "%", 3)
            show("latency_p99_of_poll", [p / (POLL * 10) for p in p99s], "%", 3)


if __name__ == "__main__":
    main()
