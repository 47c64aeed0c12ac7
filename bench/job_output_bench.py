"""What a job's output costs: the worker's log it makes, and the job's own pace.

A job's output is drained from its pipe by the worker, and the log keeps only
the first lines of it (--log-output-lines, --log-output-bytes). Two jobs that
write a lot, each run alone by `pgqctl worker --burst` (text log, on a file):

- bulk: 1 GiB in lines of 1 KiB (`yes 000...0 | head -c 1073741824`);
- lines: `yes | head -c 20000000`, 20 MB of 2-byte lines.

For each it prints the size of the worker's log, the job's run time as the
worker logged it (`job N done in ...`), and, in the same round, no worker:
the same command with its output to /dev/null (`alone`), and through a pipe
that `cat` drains to /dev/null (`piped`, the pace of a pipe read as fast as
it fills). The ratio job/piped says how much the worker slows the job down.

    python bench/job_output_bench.py [--dsn DSN] [--rounds 3] [--quick]

--quick runs a tenth of each size. Without --dsn it uses PGQCTL_TEST_DSN,
else an embedded PostgreSQL in a temp data directory of its own, stopped at
the end. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import throwaway_db
from report import say, summary

from pgqctl.durations import parse_duration

CASES = {
    "bulk": "yes " + "0" * 1023 + " | head -c {n}",
    "lines": "yes | head -c {n}",
}
SIZES = {"bulk": 1024**3, "lines": 20_000_000}
DONE = re.compile(r"job \d+ done in (\S+)")


def run_job(dsn: str, script: str, log: Path) -> tuple[int, float]:
    """Run one job writing with `script` through a burst worker; the log's
    size in bytes and the job's run time as the worker logged it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM jobs")
        conn.execute(
            "INSERT INTO jobs (kind, payload) VALUES ('bench', %s)",
            (psycopg.types.json.Jsonb({"argv": ["sh", "-c", script]}),),
        )
    with log.open("wb") as err:
        subprocess.run(
            [sys.executable, "-m", "pgqctl", "worker", "--dsn", dsn, "--burst"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            check=True,
        )
    with log.open("rb") as f:
        found = DONE.findall(f.read().decode("utf-8", "replace")[-4096:])
    if not found:
        raise SystemExit(f"the job did not end done; see {log}")
    return log.stat().st_size, parse_duration(found[-1], what="a duration")


def run_alone(script: str) -> float:
    """Seconds the command takes with no worker, its output to /dev/null."""
    began = time.perf_counter()
    subprocess.run(["sh", "-c", script], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tenth of each size")
    args = parser.parse_args()
    scale = 10 if args.quick else 1
    figures: dict[tuple[str, str], list[float]] = {}
    with (
        throwaway_db.server(args.dsn) as admin,
        throwaway_db.database(admin) as dsn,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for round_ in range(args.rounds):
            for name, template in CASES.items():
                size = SIZES[name] // scale
                script = template.format(n=size)
                say(f"round {round_ + 1}: {name}, {size:,} bytes")
                log_bytes, job = run_job(dsn, script, Path(tmp) / f"{name}.log")
                alone = run_alone(script)
                piped = run_alone(f"{script} | cat")
                for key, value in (
                    ((f"{name}.output", "MB"), size / 1e6),
                    ((f"{name}.log", "kB"), log_bytes / 1e3),
                    ((f"{name}.job", "s"), job),
                    ((f"{name}.alone", "s"), alone),
                    ((f"{name}.piped", "s"), piped),
                    ((f"{name}.job_rate", "MB/s"), size / 1e6 / job),
                    ((f"ratio {name}.job/piped", "x"), job / piped),
                ):
                    figures.setdefault(key, []).append(value)
    for (name, unit), values in figures.items():
        print(f"{name}: {summary(values, unit)}")


if __name__ == "__main__":
    os.environ.pop("PGQCTL_DSN", None)
    main()
