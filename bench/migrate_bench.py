"""How long `pgqctl migrate` holds writers off while it upgrades a big, live
queue from the oldest release's schema.

A database is migrated by release 5414984 (from this repository's history)
and filled with finished and pending jobs; that release's worker runs the
pending ones, and a producer inserts one job per transaction, timing each
insert. Then `pgqctl migrate` of the code under test runs: the pgqctl of
this checkout, or of another commit (--code REV).

Prints the migrate's wall time, the longest insert, and the time inserts
spent waiting (inserts slower than 100 ms). A measurement, never a test.

    python bench/migrate_bench.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python bench/migrate_bench.py --code 5b479ec   # the migrations before the steps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import throwaway_db

REPO = Path(__file__).resolve().parent.parent
OLDEST_RELEASE = "5414984"
SLOW_INSERT = 0.1  # seconds: an insert this slow waited for a lock


def extract(rev: str, into: Path) -> Path:
    """The code of a commit, in a directory of its own."""
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def pgqctl(code: Path, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQCTL_")}
    return subprocess.Popen(
        [sys.executable, "-m", "pgqctl", *args],
        env={**env, "PYTHONPATH": str(code)},
        cwd=code,
        text=True,
        **kwargs,  # type: ignore[call-overload]
    )


class Producer(threading.Thread):
    """Inserts one job per transaction, as the release's enqueue does."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                start = time.perf_counter()
                conn.execute(
                    "INSERT INTO jobs (kind, payload) VALUES ('bench', %s)",
                    (json.dumps({"argv": ["true"]}),),
                )
                self.latencies.append(time.perf_counter() - start)
                time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQCTL_TEST_DSN"), required=False)
    parser.add_argument(
        "--code", default=None, help="commit whose migrate runs (default: this checkout)"
    )
    parser.add_argument("--done", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--pending", type=int, default=100_000, help="pending jobs")
    args = parser.parse_args()
    if not args.dsn:
        parser.error("--dsn (or PGQCTL_TEST_DSN): a server where the bench may create a database")

    work = Path(tempfile.mkdtemp(prefix="pgqctl-migrate-bench-"))
    old = extract(OLDEST_RELEASE, work / "release")
    code = extract(args.code, work / "code") if args.code else REPO
    try:
        with throwaway_db.database(args.dsn, migrated=False) as dsn:
            assert pgqctl(old, "migrate", "--dsn", dsn).wait() == 0
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
                    "SELECT 'history', '{}', 'done', 1, now() FROM generate_series(1, %s)",
                    (args.done,),
                )
                conn.execute(
                    "INSERT INTO jobs (kind, payload) "
                    "SELECT 'backlog', %s FROM generate_series(1, %s)",
                    (json.dumps({"argv": ["true"]}), args.pending),
                )
                conn.execute("VACUUM ANALYZE jobs")
            loaded = f"{args.done:,} done and {args.pending:,} pending jobs"
            print(f"# {loaded}, schema of {OLDEST_RELEASE}")
            worker = pgqctl(
                old, "worker", "--dsn", dsn, "--concurrency", "1", stderr=subprocess.DEVNULL
            )
            producer = Producer(dsn)
            producer.start()
            time.sleep(2)
            before = len(producer.latencies)
            start = time.perf_counter()
            migrated = pgqctl(code, "migrate", "--dsn", dsn, stderr=subprocess.PIPE)
            _, log = migrated.communicate()
            took = time.perf_counter() - start
            during = producer.latencies[before:]
            time.sleep(1)
            producer.stop.set()
            producer.join()
            worker.terminate()
            worker.wait()
            print(f"# migrate by {args.code or 'this checkout'}: exit {migrated.returncode}")
            if migrated.returncode != 0:
                print(log)
            slow = [t for t in during if t > SLOW_INSERT]
            print(f"migrate took {took:.1f} s; {len(during)} inserts meanwhile")
            print(
                f"longest insert {max(during):.3f} s; {len(slow)} inserts over {SLOW_INSERT}s, "
                f"{sum(slow):.1f} s waiting in all"
            )
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()
