"""Options read PGQCTL_<OPTION>, except those that choose what a command changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import click
import psycopg

from tests.conftest import run_cli
from tests.support.jobrows import add_jobs, expired


def test_format_and_schema_come_from_the_environment(dsn: str) -> None:
    result = run_cli("migrate", "--status", env={"PGQCTL_DSN": dsn, "PGQCTL_FORMAT": "csv"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("name,status,applied_at,locks,writers,reads,estimate\n")
    other = run_cli("migrate", "--check", env={"PGQCTL_DSN": dsn, "PGQCTL_SCHEMA": "elsewhere"})
    assert other.exit_code == 3


def test_a_workers_queue_variable_does_not_narrow_requeue(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 2, status="failed", queue="mail", attempts=3)
    add_jobs(conn, 1, status="failed", queue="billing", attempts=3)
    env = {"PGQCTL_QUEUE": "mail", "PGQCTL_KIND": "nothing", "PGQCTL_DRY_RUN": "1"}
    result = run_cli("requeue", "--failed", "--dsn", dsn, env=env)
    assert result.exit_code == 0, result.stderr
    (pending,) = conn.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone() or (
        0,
    )
    assert pending == 3


def test_enqueue_takes_one_queue_from_the_environment_never_a_workers_list(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    one = run_cli("enqueue", "ping", "--dsn", dsn, env={"PGQCTL_QUEUE": "mail "})
    assert one.exit_code == 0, one.stderr
    # A worker's list would make a queue named "mail billing" that nobody reads.
    both = run_cli("enqueue", "ping", "--dsn", dsn, env={"PGQCTL_QUEUE": "mail billing"})
    assert both.exit_code == 2
    assert "names several queues" in both.stderr and "(from PGQCTL_QUEUE)" in both.stderr
    given = run_cli(
        "enqueue", "ping", "--queue", "billing", "--dsn", dsn, env={"PGQCTL_QUEUE": "a b"}
    )
    assert given.exit_code == 0, given.stderr
    assert conn.execute("SELECT queue FROM jobs ORDER BY id").fetchall() == [
        ("mail",),
        ("billing",),
    ]


def test_a_stray_dry_run_variable_does_not_disable_reap(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expired(conn, 1)
    result = run_cli("reap", "--dsn", dsn, env={"PGQCTL_DRY_RUN": "1"})
    assert result.exit_code == 0, result.stderr
    assert conn.execute("SELECT status FROM jobs").fetchone() == ("pending",)


def test_every_option_but_the_selections_reads_its_variable() -> None:
    from pgqctl.cli import cli

    def options(cmd: click.Command, path: str) -> Iterator[tuple[str, click.Option]]:
        for param in cmd.params:
            if isinstance(param, click.Option):
                yield path, param
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from options(sub, f"{path} {name}")

    found = list(options(cli, "pgqctl"))
    assert any(path == "pgqctl worker" for path, _ in found)
    for path, option in found:
        if option.allow_from_autoenv:
            flag = max(option.opts, key=len)
            assert option.envvar, f"{path} {flag} reads no variable"


def test_the_worker_reads_its_options_from_the_environment(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    assert run_cli("migrate", "--schema", "staging", "--dsn", dsn).exit_code == 0
    (public_job,) = add_jobs(conn)
    staging = conn.execute(
        "INSERT INTO staging.jobs (kind, payload) VALUES ('test', '{\"argv\": [\"true\"]}') "
        "RETURNING id"
    ).fetchone()
    assert staging is not None
    env = {
        **os.environ,
        "PGQCTL_DSN": dsn,
        "PGQCTL_SCHEMA": "staging",
        "PGQCTL_BURST": "1",
        "PGQCTL_CONCURRENCY": "3",
        "PGQCTL_LOG_FORMAT": "json",
    }
    worker = run_worker(env)
    assert worker.returncode == 0, worker.stderr
    started = json.loads(worker.stderr.splitlines()[0])
    assert (started["event"], started["schema"], started["concurrency"]) == (
        "worker_started",
        "staging",
        3,
    )
    done = conn.execute("SELECT status FROM staging.jobs WHERE id = %s", staging).fetchone()
    assert done == ("done",)
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (public_job,)).fetchone() == (
        "pending",
    )

    env["PGQCTL_CONCURRENCY"] = "abc"
    bad = run_worker(env)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "abc" in bad.stderr


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`pgqctl worker` with only this environment; a timeout, not a hang, if it never ends."""
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_value_from_a_variable_names_the_variable(dsn: str) -> None:
    result = run_cli("purge", "--dry-run", "--dsn", dsn, env={"PGQCTL_BATCH_SIZE": "0"})
    assert result.exit_code == 2
    assert "(from PGQCTL_BATCH_SIZE)" in result.stderr
    typed = run_cli("purge", "--dry-run", "--batch-size", "0", "--dsn", dsn)
    assert typed.exit_code == 2 and "(from" not in typed.stderr
