"""A worker near its capacity while a session holds an xid, then released.

    python bench/horizon_bench.py [--dsn DSN] [--warmup 90] [--baseline 60] [--hold 120]
                                  [--after 60] [--concurrency 4] [--load 0.8 | --rate R]

DSN: --dsn, else PGQCTL_TEST_DSN, else an embedded PostgreSQL of its own
(autovacuum on, as in production: a server without it says so and the
"after" phase means little). The bench makes a database of its own there.

1. Capacity: `pgqctl worker --burst --concurrency N` drains 3,000 `true`
   jobs; its rate is the worker's capacity here.
2. A steady load of `--load` times that capacity is offered (jobs enqueued
   through `pgqctl.enqueue_many` every 100 ms, due at once) to a running
   `pgqctl worker --concurrency N`,
   for `--warmup` seconds not measured (and until fewer jobs are due than
   a second of the load, for up to --warmup more), then three phases: `--baseline`
   seconds clean, `--hold` seconds while another session sits idle in a
   transaction that holds an xid (`BEGIN; SELECT txid_current();`), and
   `--after` seconds once it rolled back.
   At the end of the hold, `pgqctl doctor` runs and its findings are printed.
3. Per phase: throughput (jobs done per second, the median of 5-second
   buckets, and the lowest bucket), latency from due to done (the job's
   run_at to its finished_at: the wait for a claim plus the few ms `true`
   runs; p50 and p99), and the peak of jobs's dead tuples and of its size,
   sampled every second. Then the ratios hold/baseline and after/baseline,
   and how soon after the release the 5-second throughput and p99 latency
   came back within 10% and 1.5x of the baseline's.

Not a test: it prints figures. Nothing is tuned here; it measures the
worker and the settings `migrate` gives jobs as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import throwaway_db
from report import verdict

from pgqctl import enqueue_many

REPO = Path(__file__).resolve().parent.parent
TRUE_JOB = json.dumps({"argv": ["true"]})
LOAD_JOB = {"kind": "load", "payload": {"argv": ["true"]}}


def pgqctl(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pgqctl", *args, "--dsn", dsn]


def capacity(dsn: str, concurrency: int, jobs: int = 3000) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (kind, payload) SELECT 'warm', %s::jsonb FROM generate_series(1, %s)",
            (TRUE_JOB, jobs),
        )
    subprocess.run(
        pgqctl(dsn, "worker", "--burst", "--concurrency", str(concurrency)),
        cwd=REPO,
        check=True,
        stderr=subprocess.DEVNULL,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) / extract(epoch FROM max(finished_at) - min(finished_at))"
            " FROM jobs WHERE kind = 'warm'"
        ).fetchone()
        conn.execute("DELETE FROM jobs")
        conn.execute("VACUUM ANALYZE jobs")
    assert row is not None
    return float(row[0])


class Producer(threading.Thread):
    """Enqueues `rate` jobs a second through pgqctl's API, in batches every
    100 ms, due at once (each batch notifies the workers, as a user's would)."""

    def __init__(self, dsn: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.dsn, self.rate = dsn, rate
        self.stop = threading.Event()

    def run(self) -> None:
        owed = 0.0
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            next_tick = time.monotonic()
            while not self.stop.is_set():
                owed += self.rate * 0.1
                n, owed = int(owed), owed - int(owed)
                if n:
                    enqueue_many(conn, [LOAD_JOB] * n, schema="public")
                next_tick += 0.1
                time.sleep(max(0.0, next_tick - time.monotonic()))


class Sampler(threading.Thread):
    """jobs's dead tuples and size, every second, with the time."""

    def __init__(self, dsn: str) -> None:
        super().__init__(daemon=True)
        self.dsn = dsn
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, int, int]] = []  # t, dead, bytes, autovacuums

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT n_dead_tup, pg_table_size('jobs'), autovacuum_count"
                    " FROM pg_stat_user_tables WHERE relname = 'jobs'"
                ).fetchone()
                if row:
                    self.samples.append((time.time(), int(row[0]), int(row[1]), int(row[2])))
                time.sleep(1.0)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def phase_figures(
    done: list[tuple[float, float]],
    samples: list[tuple[float, int, int, int]],
    start: float,
    end: float,
) -> dict[str, Any]:
    """done: (finished_at, latency) of each load job, as epoch seconds."""
    inside = [(t, lat) for t, lat in done if start <= t < end]
    buckets = [0] * max(1, int((end - start) // 5))
    for t, _ in inside:
        i = int((t - start) // 5)
        if i < len(buckets):
            buckets[i] += 1
    rates = [b / 5 for b in buckets]
    lat = [lat for _, lat in inside]
    seen = [s for s in samples if start <= s[0] < end]
    return {
        "jobs_per_s": statistics.median(rates),
        "low_jobs_per_s": min(rates),
        "p50_latency_s": percentile(lat, 0.50),
        "p99_latency_s": percentile(lat, 0.99),
        "dead_tuples_peak": max((s[1] for s in seen), default=0),
        "table_bytes_peak": max((s[2] for s in seen), default=0),
        "autovacuums": (seen[-1][3] - seen[0][3]) if seen else 0,
    }


def recovery(
    done: list[tuple[float, float]], base: dict[str, Any], released: float, end: float
) -> float | None:
    """Seconds after the release until a 5-second bucket is back within 10% of
    the baseline throughput and 1.5x its p99 latency."""
    t = released
    while t + 5 <= end:
        inside = [lat for f, lat in done if t <= f < t + 5]
        if (
            len(inside) / 5 >= 0.9 * base["jobs_per_s"]
            and percentile(inside, 0.99) <= 1.5 * base["p99_latency_s"]
        ):
            return t - released
        t += 5
    return None


def settle(dsn: str, rate: float, most: float) -> None:
    """Wait, for at most `most` seconds more, until the jobs due are fewer
    than one second of the offered load: a baseline that starts with a
    backlog (the warm-up met a stall) measures the worker's catching up,
    above the offered rate and with seconds of latency, not a steady state.
    Says so when it waited."""
    waited = 0.0
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM jobs"
                " WHERE kind = 'load' AND status = 'pending' AND run_at <= now()"
            ).fetchone()
        due = row[0] if row else 0
        if due < rate or waited >= most:
            break
        time.sleep(5)
        waited += 5
    if waited:
        steady = "settled" if due < rate else f"still {due:,} jobs due"
        print(f"warm-up: {waited:.0f} s more for a backlog to clear ({steady})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument(
        "--warmup", type=float, default=90, help="seconds of load not measured (over a naptime)"
    )
    parser.add_argument("--baseline", type=float, default=60)
    parser.add_argument("--hold", type=float, default=120)
    parser.add_argument("--after", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--load", type=float, default=0.8, help="of the measured capacity")
    parser.add_argument(
        "--rate",
        type=float,
        help="jobs/s offered, instead of --load (capacity varies on a shared machine)",
    )
    parser.add_argument(
        "--series", action="store_true", help="also print jobs done and dead tuples every 5 s"
    )
    args = parser.parse_args()

    with throwaway_db.server(args.dsn) as admin, throwaway_db.database(admin) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SHOW autovacuum").fetchone()
        if not row or row[0] != "on":
            print("# warning: autovacuum is off on this server", file=sys.stderr)
        cap = capacity(dsn, args.concurrency)
        rate = args.rate if args.rate else args.load * cap
        print(
            f"capacity: {cap:.0f} jobs/s with --concurrency {args.concurrency}; offered {rate:.0f}"
        )

        log = Path(tempfile.mkstemp(prefix="horizon-worker-", suffix=".log")[1])
        with log.open("w") as err:
            worker = subprocess.Popen(
                pgqctl(dsn, "worker", "--concurrency", str(args.concurrency)),
                cwd=REPO,
                stderr=err,
                stdout=subprocess.DEVNULL,
            )
        producer, sampler = Producer(dsn, rate), Sampler(dsn)
        started = time.time()
        producer.start()
        sampler.start()
        time.sleep(args.warmup)  # the worker started, autovacuum's first visit due
        settle(dsn, rate, args.warmup)
        t0 = time.time()
        time.sleep(args.baseline)
        holder = psycopg.connect(dsn, application_name="horizon-bench-holder")
        holder.execute("SELECT txid_current()")
        t1 = time.time()
        time.sleep(args.hold)
        # What doctor says at the end of the hold (it is not applied here).
        said = subprocess.run(
            pgqctl(dsn, "doctor", "--json", "--max-horizon-age", f"{args.hold / 2:.0f}s"),
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        for finding in json.loads(said.stdout or "{}").get("findings", []):
            print(f"doctor during the hold: {finding['summary']}; {' '.join(finding['sql'])}")
        holder.rollback()
        holder.close()
        t2 = time.time()
        time.sleep(args.after)
        t3 = time.time()
        producer.stop.set()
        producer.join()
        sampler.stop.set()
        sampler.join()
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        os.unlink(log)

        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM finished_at)::float8,"
                " extract(epoch FROM finished_at - run_at)::float8"
                " FROM jobs WHERE kind = 'load' AND status = 'done'"
            ).fetchall()
            left = conn.execute(
                "SELECT count(*) FROM jobs WHERE kind = 'load' AND status = 'pending'"
            ).fetchone()
        done = [(float(a), float(b)) for a, b in rows]
        phases = {
            "baseline": phase_figures(done, sampler.samples, t0, t1),
            "hold": phase_figures(done, sampler.samples, t1, t2),
            "after": phase_figures(done, sampler.samples, t2, t3),
        }
        header = ("phase", "jobs/s", "low", "p50 s", "p99 s", "dead peak", "MB peak", "autovacs")
        print("  ".join(f"{h:>10}" for h in header))
        for name, p in phases.items():
            cells = (
                name,
                f"{p['jobs_per_s']:.0f}",
                f"{p['low_jobs_per_s']:.0f}",
                f"{p['p50_latency_s']:.3f}",
                f"{p['p99_latency_s']:.3f}",
                f"{p['dead_tuples_peak']:,}",
                f"{p['table_bytes_peak'] / 2**20:.1f}",
                str(p["autovacuums"]),
            )
            print("  ".join(f"{c:>10}" for c in cells))
        if args.series:
            print_series(
                done, sampler.samples, started, t3, marks={t0: "baseline", t1: "hold", t2: "after"}
            )
        base = phases["baseline"]
        for name in ("hold", "after"):
            p = phases[name]
            throughput = p["jobs_per_s"] / base["jobs_per_s"]
            latency = p["p99_latency_s"] / base["p99_latency_s"]
            # The targets are the hold's; after the release, the recovery's below.
            judged = name == "hold"
            print(
                f"{name}/baseline: throughput {throughput:.2f}x"
                + (verdict(throughput, ">=", 0.8) if judged else "")
                + f", p99 latency {latency:.2f}x"
                + (verdict(latency, "<=", 3) if judged else "")
            )
        back = recovery(done, base, t2, t3)
        print(
            "back to baseline: "
            + (f"{back:.0f} s after the release" if back is not None else "not within the run")
            + verdict(back if back is not None else float("inf"), "<=", 60, " s")
            + f"; {left[0] if left else '?'} load jobs still pending at the end"
        )


def print_series(
    done: list[tuple[float, float]],
    samples: list[tuple[float, int, int, int]],
    start: float,
    end: float,
    marks: dict[float, str],
) -> None:
    """Jobs done, p99 latency and the peak of dead tuples in each 5-second bucket."""
    t = start
    while t < end:
        inside = [lat for f, lat in done if t <= f < t + 5]
        dead = max((s[1] for s in samples if t <= s[0] < t + 5), default=0)
        mark = " ".join(name for at, name in marks.items() if t <= at < t + 5)
        print(
            f"  +{t - start:5.0f} s  {len(inside) / 5:6.0f} jobs/s  p99 "
            f"{percentile(inside, 0.99):7.3f} s  dead {dead:>9,}  {mark}"
        )
        t += 5


if __name__ == "__main__":
    main()
