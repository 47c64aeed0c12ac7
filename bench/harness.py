"""What the workloads share: the run's environment, child processes, the database
helpers, and the record of every figure.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

BENCH_DIR = Path(__file__).resolve().parent
CONTENDERS = BENCH_DIR / "contenders.py"
CHILD_READY_TIMEOUT_S = 120


class Skip(Exception):
    """A contender cannot run in this checkout; the message says what it waits for."""


@dataclass(frozen=True)
class Sizes:
    rounds: int
    enqueue_jobs: int
    drain_jobs: int
    drain_workers: int
    slots: int  # jobs each drain worker takes at once (pgqueuer's default batch)
    e2e_jobs: int
    concurrencies: tuple[int, ...]
    latency_jobs: int
    history_rows: int
    history_calls: int  # calls per operation, per table, per round
    purge_rows: int
    purge_batch: int
    purge_pending: int  # jobs for the workers to claim while the purge runs


FULL = Sizes(
    rounds=4,
    enqueue_jobs=100_000,
    drain_jobs=20_000,
    drain_workers=4,
    slots=10,
    e2e_jobs=1_500,
    concurrencies=(1, 4, 8),
    latency_jobs=200,
    history_rows=1_000_000,
    history_calls=9,
    purge_rows=1_000_000,
    purge_batch=10_000,
    purge_pending=60_000,
)
QUICK = Sizes(
    rounds=3,
    enqueue_jobs=20_000,
    drain_jobs=1_500,
    drain_workers=4,
    slots=10,
    e2e_jobs=300,
    concurrencies=(1, 4, 8),
    latency_jobs=60,
    history_rows=100_000,
    history_calls=5,
    purge_rows=100_000,
    purge_batch=10_000,
    purge_pending=15_000,
)


@dataclass
class Env:
    """Where everything runs, shared by every workload."""

    sizes: Sizes
    dsns: dict[str, str]  # database role -> DSN: pgqctl, pgqueuer, procrastinate, history
    tmp: Path
    pgqctl_commands: frozenset[str]
    missing_api: dict[str, str]  # pgqctl pieces this checkout lacks (pgqctl_adapter.missing)

    @property
    def pgqctl_bin(self) -> str:
        return str(Path(sys.executable).with_name("pgqctl"))

    def require_command(self, name: str) -> None:
        if name not in self.pgqctl_commands:
            raise Skip(f"`pgqctl {name}`")

    def require_api(self, piece: str) -> None:
        if piece in self.missing_api:
            raise Skip(self.missing_api[piece])


# ------------------------------------------------------------------ figures


@dataclass
class Figure:
    unit: str
    higher_is_better: bool
    values: dict[int, float] = field(default_factory=dict)  # round -> value


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator, computed within each round, then summarised."""

    name: str
    numerator: str
    denominator: str
    target: tuple[str, float] | None = None  # (">=" | "<=" | "<", bound)

    def met(self, value: float) -> bool | None:
        if self.target is None:
            return None
        op, bound = self.target
        return {">=": value >= bound, "<=": value <= bound, "<": value < bound}[op]

    def describe_target(self) -> str:
        return "" if self.target is None else f"{self.target[0]} {self.target[1]:g}"


class Record:
    """Every figure of the run, by name and round."""

    def __init__(self) -> None:
        self.figures: dict[str, Figure] = {}
        self.skipped: dict[str, str] = {}
        self.failed: dict[str, list[tuple[int, str]]] = {}  # name -> (round, error)
        self.notes: list[str] = []

    def add(self, name: str, round_no: int, value: float, unit: str, *, higher: bool) -> None:
        figure = self.figures.setdefault(name, Figure(unit, higher))
        figure.values[round_no] = value

    def skip(self, name: str, reason: str) -> None:
        self.skipped.setdefault(name, reason)

    def fail(self, name: str, round_no: int, error: str) -> None:
        self.failed.setdefault(name, []).append((round_no, error))

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def ratio_values(self, ratio: Ratio) -> list[float]:
        top = self.figures.get(ratio.numerator)
        bottom = self.figures.get(ratio.denominator)
        if top is None or bottom is None:
            return []
        rounds = sorted(set(top.values) & set(bottom.values))
        return [top.values[r] / bottom.values[r] for r in rounds if bottom.values[r] > 0]


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile: a value that was actually observed."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * fraction // 1))
    return ordered[int(rank) - 1]


def rotated(items: Sequence[Any], round_no: int) -> list[Any]:
    """The items starting at a different one each round, so none always goes first."""
    if not items:
        return []
    shift = round_no % len(items)
    return [*items[shift:], *items[:shift]]


def say(message: str) -> None:
    """Progress on stderr; figures go to stdout at the end."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------- child processes


class Child:
    """One contender process running an action of contenders.py."""

    def __init__(self, action: str, config: dict[str, Any]) -> None:
        self.action = action
        # Lives as long as the child; closed with it (kill).
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, str(CONTENDERS), action, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=BENCH_DIR,
        )

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], CHILD_READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            self.kill()
            raise RuntimeError(f"{self.action} did not start: {self.error_tail()}")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.action} did not finish within {timeout:.0f} s") from None
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"{self.action} failed (exit {self.proc.returncode}): {self.error_tail()}"
            )
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def error_tail(self) -> str:
        """The exception a child died of (its first lines), else its last lines."""
        self.stderr.seek(0)
        lines = [line for line in self.stderr.read().splitlines() if line.strip()]
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback")]
        if starts:
            # After the traceback's indented frames: the exception and its detail.
            message = [line for line in lines[starts[-1] + 1 :] if not line[0].isspace()]
            if message:
                return " | ".join(message[:3])
        return " | ".join(lines[-3:]) or "no output"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        # Keep the file: error_tail may still read it; the GC closes it.


def run_children(
    action: str, configs: Sequence[dict[str, Any]], timeout: float, *, barrier: bool = True
) -> tuple[float, list[dict[str, Any]]]:
    """Run children to the end; return (start time, their results).

    With the barrier, every child sets up first and they start together on
    ``go``; the start time is then. Without it (the config must say
    ``"barrier": false``), they start as they launch.
    """
    go = time.time()
    children = [Child(action, config) for config in configs]
    try:
        if barrier:
            for child in children:
                child.wait_ready()
            go = time.time()
            for child in children:
                child.send("go")
        return go, [child.result(timeout) for child in children]
    finally:
        for child in children:
            child.kill()


def run_child(action: str, config: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One child through the barrier: for setup steps and timed single calls."""
    return run_children(action, [config], timeout)[1][0]


# ----------------------------------------------------------------- database


def dsn_for(server: str, dbname: str) -> str:
    return conninfo.make_conninfo(server, dbname=dbname)


@contextmanager
def connect(dsn: str, schema: str | None = None) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if schema:
            conn.execute("SELECT set_config('search_path', %s, false)", (schema,))
        yield conn


def execute(dsn: str, statement: str | sql.Composable, schema: str | None = None) -> None:
    with connect(dsn, schema) as conn:
        conn.execute(statement)  # type: ignore[arg-type]


def scalar(dsn: str, statement: str, schema: str | None = None) -> Any:
    with connect(dsn, schema) as conn:
        row = conn.execute(statement).fetchone()  # type: ignore[arg-type]
        return row[0] if row else None


def truncate_all(dsn: str, prefix: str) -> None:
    """Empty every table of the database whose name starts with prefix."""
    with connect(dsn) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                " AND tablename LIKE %s ORDER BY tablename",
                (prefix + "%",),
            )
        ]
        if names:
            tables = sql.SQL(", ").join(sql.Identifier(name) for name in names)
            conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(tables))


def run_pgqctl(env: Env, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the pgqctl command; raise with its error line if it fails."""
    done = subprocess.run(
        [env.pgqctl_bin, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PGQCTL_DEBUG": ""},
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgqctl {args[0]} failed: {done.stderr.strip()[-300:]}")
    return done
