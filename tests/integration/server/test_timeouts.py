"""No command waits for ever behind a lock: with `jobs` locked by another
session, each command gives up at its lock timeout with exit 1 and one line
naming that session, and the worker says who blocks it and goes on.

The commands run as real processes, so that one that would wait for ever
fails the test (at GIVE_UP) instead of hanging the suite.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.commands.test_metrics import _scrape, _serve
from tests.support.jobrows import insert_jobs
from tests.support.processes import PgqctlProcess, start_worker, wait_until
from tests.support.servers import Pooler, start_pooler

__all__ = ["start_pooler", "start_worker"]  # fixtures these tests use

# Far above any timeout set here: only a command that waits for the lock's
# end, as before timeouts, gets near it.
GIVE_UP = 60.0


@pytest.fixture
def locker(dsn: str) -> Iterator[int]:
    """Another session holding `jobs` in ACCESS EXCLUSIVE mode, idle in its
    transaction, as `BEGIN; LOCK TABLE jobs ...` in psql leaves it; its pid."""
    with psycopg.connect(dsn, application_name="locker") as seed:
        insert_jobs(seed, [{"argv": ["true"]}])
        seed.commit()
    with psycopg.connect(dsn, application_name="locker") as holder:
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        yield holder.info.backend_pid
        with contextlib.suppress(psycopg.OperationalError):  # ended by the test
            holder.rollback()


def pgqctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=GIVE_UP,
        stdin=subprocess.DEVNULL,
    )


def assert_names_the_locker(stderr: str, pid: int, what: str) -> None:
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"pgqctl: error: {what} waited 1s for a lock on jobs held by "), stderr
    assert f"pid {pid} (locker, idle in transaction, transaction open " in stderr
    assert stderr.endswith(
        f"end it with SELECT pg_terminate_backend({pid}); or raise --lock-timeout\n"
    )


COMMANDS = {
    "stats": ["stats"],
    "check": ["check"],
    "metrics": ["metrics"],
    "workers": ["workers"],
    "enqueue": ["enqueue", "report", '{"argv": ["true"]}'],
    "cancel": ["cancel", "--id", "1"],
    "list": ["list"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_behind_a_lock_gives_up_naming_its_holder(
    dsn: str, locker: int, name: str
) -> None:
    # The timeout from its variable (the option's own test is below).
    done = pgqctl(*COMMANDS[name], "--dsn", dsn, env={"PGQCTL_LOCK_TIMEOUT": "1s"})
    assert done.returncode == 1  # check: its "cannot tell" code
    assert done.stdout == ""
    assert_names_the_locker(done.stderr, locker, name)


def test_metrics_textfile_behind_a_lock_writes_nothing(
    dsn: str, locker: int, tmp_path: Path
) -> None:
    path = tmp_path / "pgqctl.prom"
    done = pgqctl("metrics", "--dsn", dsn, "--textfile", str(path), "--lock-timeout", "1s")
    assert done.returncode == 1
    assert_names_the_locker(done.stderr, locker, "metrics")
    assert os.listdir(tmp_path) == []


def test_the_timeouts_as_global_options(dsn: str, locker: int) -> None:
    before = pgqctl("--lock-timeout", "1s", "list", "--dsn", dsn)
    assert before.returncode == 1
    assert_names_the_locker(before.stderr, locker, "list")
    # No lock timeout: the statement timeout ends the wait.
    statement = pgqctl("--statement-timeout", "1s", "stats", "--dsn", dsn, "--lock-timeout", "0")
    assert statement.returncode == 1
    assert statement.stderr.startswith(
        "pgqctl: error: stats ran 1s (its statement timeout) waiting for a lock on jobs "
        f"held by pid {locker} (locker, idle in transaction, "
    ), statement.stderr
    assert statement.stderr.endswith(
        f"end it with SELECT pg_terminate_backend({locker}); or raise --statement-timeout\n"
    )
    # Given before the command and after it: refused, as --schema is.
    twice = pgqctl("--lock-timeout", "1s", "stats", "--dsn", dsn, "--lock-timeout", "2s")
    assert twice.returncode == 2
    assert "--lock-timeout was given before the command and after it" in twice.stderr


def test_through_a_transaction_pooler_too(
    dsn: str, locker: int, start_pooler: Callable[..., Pooler]
) -> None:
    """The timeouts are set in each transaction, and the holder is looked
    for on another connection: both work through PgBouncer."""
    pooled = start_pooler("transaction", pool_size=2).dsn(dsn)
    done = pgqctl("stats", "--dsn", pooled, "--lock-timeout", "1s")
    assert done.returncode == 1
    assert_names_the_locker(done.stderr, locker, "stats")


def test_check_gives_up_by_itself(dsn: str, locker: int) -> None:
    """With no timeout given, check's own default (2s) ends it: a probe or
    a cron check never piles up."""
    done = pgqctl("check", "--dsn", dsn)
    assert done.returncode == 1
    assert done.stderr.startswith("pgqctl: error: check waited 2s for a lock on jobs held by ")
    assert f"pid {locker} (locker, " in done.stderr


def test_each_metrics_scrape_behind_a_lock_is_answered(
    dsn: str, locker: int, conn: psycopg.Connection[Any]
) -> None:
    os.environ["PGQCTL_LOCK_TIMEOUT"] = "1s"
    try:
        proc, url = _serve(dsn)
    finally:
        del os.environ["PGQCTL_LOCK_TIMEOUT"]
    try:
        for _ in range(2):
            status, body = _scrape(url)
            assert status == 503
            assert body.startswith("metrics waited 1s for a lock on jobs held by ")
            assert f"pid {locker} (locker, idle in transaction, " in body
        conn.execute("SELECT pg_terminate_backend(%s)", (locker,))
        status, body = _scrape(url)
        assert status == 200 and "pgqctl_jobs{" in body
    finally:
        proc.terminate()
        assert proc.wait(timeout=GIVE_UP) == 0


def test_a_worker_behind_a_lock_says_who_blocks_it(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Callable[..., PgqctlProcess]
) -> None:
    worker = start_worker(dsn, "--lock-timeout", "1s", "--poll", "1s")
    worker.wait_for_log(" started: ", timeout=GIVE_UP)
    with psycopg.connect(dsn, application_name="locker") as holder:
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        pid = holder.info.backend_pid
        worker.wait_for_log(f"blocked by pid {pid} (locker, idle in transaction, ", GIVE_UP)
        holder.rollback()
    assert "database unavailable" not in worker.log
    assert f"SELECT pg_terminate_backend({pid}); ends it" in worker.log
    # Once the lock goes, it works on.
    (job_id,) = insert_jobs(conn, [{"argv": ["true"]}])
    wait_until(
        lambda: (
            conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone() == ("done",)
        ),
        GIVE_UP,
        "the job done",
    )
    worker.proc.terminate()
    assert worker.finish(timeout=GIVE_UP) == 0
