"""An installation upgraded from before the history moves its finished jobs
into it online, while its workers and producers run.

1. A database is migrated by release 5414984 (from this repository's
   history) and loaded with --done finished jobs, their ends spread over the
   30 days before an hour ago, all in jobs as that release keeps them.
2. That release's worker and a producer (one insert per transaction, every
   job's id kept) start, and stay up to the end.
3. `pgqctl migrate` of this checkout adds the history.
4. --workers workers of this checkout start with --no-archive and run the
   producer's jobs for --quiet seconds: the jobs' wait before the move.
5. They are stopped and started again as they come by default, moving the
   history as a chore of their upkeep, until no loaded job is left in jobs.
6. The producer stops; once its last job has run the workers stop.

Prints the load, the migrate, the move's wall time and rows a second, the
producer's longest insert and its errors, the producer's jobs' wait from
insert to start (p50, p99) before and during the move, and what a user would
check afterwards: every loaded job in the history and none left in jobs,
every produced job done exactly once (one row, one attempt), no job failed,
the workers' exit codes and any log line that is not a job's start or end.
A measurement, never a test.

    python bench/history_upgrade_bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
        [--done 10000000] [--workers 2] [--quiet 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

import psycopg
import throwaway_db
from migrate_bench import OLDEST_RELEASE, REPO, SLOW_INSERT, extract, pgqctl

LOAD = """
INSERT INTO jobs (kind, payload, status, attempts, created_at, finished_at)
SELECT 'history', '{}', 'done', 1, ends - interval '1 second', ends
FROM (SELECT now() - interval '1 hour' - interval '30 days' * i / %(n)s AS ends
      FROM generate_series(1, %(n)s) AS i) AS loaded
"""
LEFT_IN_JOBS = "SELECT count(*) FROM jobs WHERE kind = 'history'"
# The oldest loaded job still in jobs (jobs_finished_idx: a probe, where a
# count would read the table every time and slow what it watches).
OLDEST_LEFT = """
SELECT extract(epoch FROM (SELECT min(finished_at) FROM jobs
                           WHERE status = 'done' AND finished_at >= '2000-01-01Z'
                             AND finished_at <= %(ends)s) - %(ends)s)
"""
# A worker's log events that are part of running jobs; any other is counted.
ROUTINE = {"worker_started", "worker_stopped", "stopping", "started", "done", "archived"}


class Producer(threading.Thread):
    """Inserts one job per transaction, as the release's enqueue does, and
    keeps each job's id and the time it was inserted."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.inserted: list[tuple[int, float]] = []  # (id, monotonic time)
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    (job_id,) = conn.execute(
                        "INSERT INTO jobs (kind, payload) VALUES ('live', %s) RETURNING id",
                        (json.dumps({"argv": ["true"]}),),
                    ).fetchone() or (None,)
                except psycopg.Error as exc:
                    self.errors.append(str(exc).splitlines()[0])
                    time.sleep(0.1)
                    continue
                self.latencies.append(time.perf_counter() - start)
                self.inserted.append((int(job_id), start))
                time.sleep(0.01)


def start_workers(code: Path, dsn: str, n: int, logs: Path, phase: str, *extra: str) -> list[Any]:
    workers = []
    for i in range(n):
        log = (logs / f"{phase}-{i}.log").open("w")
        worker = pgqctl(
            code,
            "worker",
            "--dsn",
            dsn,
            "--concurrency",
            "2",
            "--log-format",
            "json",
            *extra,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        workers.append((worker, log))
    return workers


def stop_workers(workers: list[Any]) -> list[int]:
    for worker, _ in workers:
        worker.terminate()
    codes = [worker.wait() for worker, _ in workers]
    for _, log in workers:
        log.close()
    return codes


def unusual_lines(log: IO[str] | Path) -> list[str]:
    """The log lines that are not a job's start or end, nor the worker's."""
    found = []
    for line in Path(str(log)).read_text().splitlines():
        try:
            event = json.loads(line).get("event")
        except ValueError:
            found.append(line)
            continue
        if event not in ROUTINE:
            found.append(line)
    return found


def waits(conn: psycopg.Connection[Any], ids: list[int]) -> list[float]:
    """Seconds from insert to claim of each job (by the server's clock)."""
    rows = conn.execute(
        "SELECT extract(epoch FROM claimed_at - created_at) FROM all_jobs WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    return sorted(float(r[0]) for r in rows if r[0] is not None)


def pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQCTL_TEST_DSN"), required=False)
    parser.add_argument("--done", type=int, default=10_000_000, help="finished jobs to move")
    parser.add_argument("--workers", type=int, default=2, help="workers of this checkout")
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds before the move")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or PGQCTL_TEST_DSN): a server where the bench may create a database")

    work = Path(tempfile.mkdtemp(prefix="pgqctl-history-upgrade-bench-"))
    old = extract(OLDEST_RELEASE, work / "release")
    try:
        with throwaway_db.database(args.dsn, migrated=False) as dsn:
            assert pgqctl(old, "migrate", "--dsn", dsn, stderr=subprocess.DEVNULL).wait() == 0
            began = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(LOAD, {"n": args.done})
                conn.execute("VACUUM ANALYZE jobs")
                (ends,) = conn.execute("SELECT max(finished_at) FROM jobs").fetchone() or (None,)
            print(f"# {args.done:,} done jobs in jobs, schema of {OLDEST_RELEASE}")
            print(f"load: {time.perf_counter() - began:.0f} s")

            old_log = (work / "release.log").open("w")
            release_worker = pgqctl(
                old,
                "worker",
                "--dsn",
                dsn,
                "--concurrency",
                "1",
                stdout=subprocess.DEVNULL,
                stderr=old_log,
            )
            producer = Producer(dsn)
            producer.start()
            time.sleep(2)

            start = time.perf_counter()
            migrated = pgqctl(REPO, "migrate", "--dsn", dsn, stderr=subprocess.PIPE)
            _, log = migrated.communicate()
            print(f"migrate: {time.perf_counter() - start:.1f} s, exit {migrated.returncode}")
            if migrated.returncode != 0:
                print(log)
                return

            quiet_from = len(producer.inserted)
            workers = start_workers(REPO, dsn, args.workers, work, "quiet", "--no-archive")
            time.sleep(args.quiet)
            codes = stop_workers(workers)
            quiet_ids = [job_id for job_id, _ in producer.inserted[quiet_from:]]

            move_from = len(producer.inserted)
            move_began = time.perf_counter()
            workers += start_workers(REPO, dsn, args.workers, work, "moving")
            with psycopg.connect(dsn, autocommit=True) as conn:
                while True:
                    time.sleep(5)
                    (behind,) = conn.execute(OLDEST_LEFT, {"ends": ends}).fetchone() or (None,)
                    took = time.perf_counter() - move_began
                    # The loaded jobs' ends are spread evenly over 30 days.
                    left = 0 if behind is None else -float(behind) / (30 * 86400) * args.done
                    print(f"# {took:6.0f} s: about {left:,.0f} loaded jobs left", file=sys.stderr)
                    if behind is None:
                        break
            moved_in = time.perf_counter() - move_began
            during = producer.inserted[move_from:]
            move_ids = [job_id for job_id, _ in during]
            move_latencies = producer.latencies[move_from : move_from + len(during)]

            producer.stop.set()
            producer.join()
            produced = [job_id for job_id, _ in producer.inserted]
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(600):
                    (unrun,) = conn.execute(
                        "SELECT count(*) FROM all_jobs WHERE id = ANY(%s) AND status <> 'done'",
                        (produced,),
                    ).fetchone() or (0,)
                    if unrun == 0:
                        break
                    time.sleep(1)
            codes += stop_workers(workers[len(codes) :])
            release_worker.terminate()
            release_code = release_worker.wait()
            old_log.close()

            with psycopg.connect(dsn, autocommit=True) as conn:
                (in_history,) = conn.execute(
                    "SELECT count(*) FROM jobs_history WHERE kind = 'history'"
                ).fetchone() or (0,)
                (left,) = conn.execute(LEFT_IN_JOBS).fetchone() or (0,)
                rows = conn.execute(
                    "SELECT id, status, attempts FROM all_jobs WHERE id = ANY(%s)", (produced,)
                ).fetchall()
                (failed,) = conn.execute(
                    "SELECT count(*) FROM all_jobs WHERE status = 'failed'"
                ).fetchone() or (0,)
                quiet_waits, move_waits = waits(conn, quiet_ids), waits(conn, move_ids)

            seen: dict[int, int] = {}
            for job_id, _, _ in rows:
                seen[job_id] = seen.get(job_id, 0) + 1
            once = sum(1 for job_id, status, attempts in rows if status == "done" and attempts == 1)
            slow = [t for t in move_latencies if t > SLOW_INSERT]
            rate = args.done / moved_in
            print(f"move: {moved_in:.0f} s, {rate:,.0f} rows/s with {args.workers} workers")
            print(f"loaded jobs in the history: {in_history:,} of {args.done:,}; in jobs: {left:,}")
            print(
                f"producer: {len(produced):,} jobs, {len(during):,} during the move; "
                f"errors {len(producer.errors)}"
            )
            print(
                f"insert during the move: longest {max(move_latencies, default=0):.3f} s, "
                f"median {statistics.median(move_latencies or [0]) * 1000:.1f} ms, "
                f"{len(slow)} over {SLOW_INSERT} s"
            )
            for label, values in (
                ("before the move", quiet_waits),
                ("during the move", move_waits),
            ):
                print(
                    f"wait insert -> claim {label}: p50 {pct(values, 0.5) * 1000:.0f} ms, "
                    f"p99 {pct(values, 0.99) * 1000:.0f} ms ({len(values):,} jobs)"
                )
            print(
                f"produced jobs done once: {once:,} of {len(produced):,}; "
                f"missing {len(set(produced) - set(seen)):,}; "
                f"in both tables {sum(1 for n in seen.values() if n > 1):,}; failed jobs {failed:,}"
            )
            print(f"worker exit codes: this checkout {codes}, release {release_code}")
            for log_path in sorted([*work.glob("quiet-*.log"), *work.glob("moving-*.log")]):
                lines = unusual_lines(log_path)
                if lines:
                    print(f"{log_path.name}: {len(lines)} unusual line(s), e.g. {lines[0][:200]}")
            release_lines = [
                line
                for line in (work / "release.log").read_text().splitlines()
                if any(word in line.lower() for word in ("error", "traceback", "lost", "fenced"))
            ]
            print(f"release worker: {len(release_lines)} error line(s)")
            for error in producer.errors[:3]:
                print(f"producer error: {error}")
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
