"""`enqueue --file -` fed by a slow producer, on a database that ends idle transactions.

Production databases often set `idle_in_transaction_session_timeout` so that
a forgotten transaction cannot hold locks and the xmin horizon forever. A
producer that pauses between lines (a script still computing the next batch)
must not lose its load to that timeout; and a bad line that comes after the
pause must still leave nothing inserted.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.servers import REPO_ROOT, clean_env, dbname_of, statuses

TIMEOUT_S = 2
PAUSE_S = 3  # longer than the timeout


@pytest.fixture
def strict_dsn(dsn: str) -> str:
    """The test's database, where a transaction left idle for 2 s is ended by the server."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = {}").format(
                sql.Identifier(dbname_of(dsn)), sql.Literal(f"{TIMEOUT_S}s")
            )
        )
    return dsn


def enqueue_slowly(
    dsn: str, first: list[str], then: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """`enqueue --file -` reading `first`, then after a pause `then`, from a pipe."""
    out, err = tmp_path / "enqueue.out", tmp_path / "enqueue.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgqctl", "enqueue", "--dsn", dsn, "--file", "-"],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
            cwd=REPO_ROOT,
            env=clean_env(),
        )
    assert proc.stdin is not None
    try:
        proc.stdin.write("".join(line + "\n" for line in first))
        proc.stdin.flush()
        time.sleep(PAUSE_S)
        proc.stdin.write("".join(line + "\n" for line in then))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it gave up while we paused: its exit status and message say why
    try:
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, code, out.read_text(), err.read_text())


def lines(kinds: range) -> list[str]:
    return [f'{{"kind": "k{n}", "payload": {{"argv": ["true"]}}}}' for n in kinds]


@pytest.mark.slow
def test_a_pause_longer_than_the_idle_timeout_loses_nothing(
    strict_dsn: str, tmp_path: Path
) -> None:
    result = enqueue_slowly(strict_dsn, lines(range(3)), lines(range(3, 6)), tmp_path)
    assert result.returncode == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    assert len(ids) == 6
    with psycopg.connect(strict_dsn, autocommit=True) as conn:
        stored = conn.execute("SELECT id, kind FROM jobs ORDER BY id").fetchall()
    assert stored == [(i, f"k{n}") for n, i in enumerate(ids)]


@pytest.mark.slow
def test_a_bad_line_after_the_pause_still_inserts_nothing(strict_dsn: str, tmp_path: Path) -> None:
    result = enqueue_slowly(strict_dsn, lines(range(3)), ['{"kind": "k3", "payload": '], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "line 4" in result.stderr
    assert statuses(strict_dsn) == {}
